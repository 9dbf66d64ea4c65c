"""TraceBuffers: trace records of a static decode body kept in fixed device buffers, given to a Trace each step."""
from __future__ import annotations

import torch

from ..spec.errors import InputError


class TraceBuffers:
    """Stands in for the Trace inside the decode body. The first (eager) run lays out one buffer per record
    field; freeze() then moves them into one flat device tensor per dtype, at fixed addresses, so that later
    runs (and graph replays) only copy into them and the host reads a step back with one copy per dtype.

    Covered record kinds: moe, mhc (either form), engram, attention for the paths in `attention_paths`, and the
    logit lens's read-outs for the layers in `lens_paths` (both chosen at capture: a trace that wants other layers
    gets its own graph). The body's rows/positions arguments are ignored; emit() supplies the host's own.
    """

    def __init__(self, attention_paths=(), lens_paths=()):
        self.attention_paths = frozenset(attention_paths)
        self.lens_paths = frozenset(lens_paths)
        self.lens_readout = None   # the model's head, handed on with the lens records
        self._fields: dict[tuple[str, str, str], list[torch.Tensor]] = {}   # in record order
        self._layout: dict[tuple[str, str, str], list[tuple[torch.dtype, int, tuple[int, ...]]]] = {}
        self._flat: dict[torch.dtype, torch.Tensor] = {}
        self.frozen = False

    # ---- what the model calls (the Trace's interface) ----------------------------------------------
    def wants_attention(self, path: str) -> bool:
        return path in self.attention_paths

    def record_moe(self, path, rows, positions, ids, weights, scores, vision=None) -> None:
        if vision is not None:
            raise InputError("static decode has no image tokens: a vision mask reached the trace buffers")
        self._put(("moe", path, ""), (ids, weights, scores))

    def record_mhc(self, path, site, rows, positions, pre, post, comb, row_err=None, col_err=None) -> None:
        self._put(("mhc", path, site), (pre, post, comb) if row_err is None else (pre, post, comb, row_err, col_err))

    def record_mhc_mix(self, path, site, rows, positions, pre, mix) -> None:
        self._put(("mhc_mix", path, site), (pre, mix))

    def record_engram(self, path, rows, positions, compressed_ids, row_ids, gates) -> None:
        self._put(("engram", path, ""), (compressed_ids, row_ids, gates))

    def record_attention(self, path, rows, positions, topk, window_mass, compressed_mass, sink_mass) -> None:
        if path in self.attention_paths:
            self._put(("attention", path, ""), (topk, window_mass, compressed_mass, sink_mass))

    def wants_lens(self, path: str) -> bool:
        return path in self.lens_paths

    def record_lens(self, path, rows, positions, hidden, rms_in, rms_out, readout, finish=None) -> None:
        if finish is not None:  # (engine.model.lens_reads reads a static body's layers out one at a time, to the end)
            raise RuntimeError("the static decode body recorded a lens read-out not read out to the end")
        if path in self.lens_paths:
            self.lens_readout = readout
            self._put(("lens", path, ""), (hidden, rms_in, rms_out))

    def _put(self, key, tensors) -> None:
        if not self.frozen:  # the layout run: remember a copy of each field
            if key in self._fields:
                raise RuntimeError(f"trace record {key} arrived twice in one decode step")
            self._fields[key] = [t.detach().clone() for t in tensors]
            return
        bufs = self._fields.get(key)
        if bufs is None:
            raise RuntimeError(f"trace record {key} was not made by the layout run: the body's records changed")
        for buf, t in zip(bufs, tensors, strict=True):
            buf.copy_(t)

    # ---- layout and read-back ----------------------------------------------------------------------
    def freeze(self) -> None:
        """After the layout run: one flat buffer per dtype; every field becomes a view of it (values kept)."""
        if self.frozen:
            return
        sizes: dict[torch.dtype, int] = {}
        for fields in self._fields.values():
            for t in fields:
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        device = next((t.device for f in self._fields.values() for t in f), None)
        self._flat = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()}
        offset = dict.fromkeys(sizes, 0)
        for key, fields in self._fields.items():
            views, layout = [], []
            for t in fields:
                o = offset[t.dtype]
                view = self._flat[t.dtype][o:o + t.numel()].view(t.shape)
                view.copy_(t)
                views.append(view)
                layout.append((t.dtype, o, tuple(t.shape)))
                offset[t.dtype] = o + t.numel()
            self._fields[key], self._layout[key] = views, layout
        self.frozen = True

    def emit(self, trace, rows: torch.Tensor, positions: torch.Tensor, n: int, topk_width=None) -> None:
        """Hand the last step's records of the first n (live) rows to `trace`, in the order the body made
        them: rows [n], positions [n, k] on the CPU, k ≤ S (only each row's first k tokens are handed over).
        topk_width(path) → how many index entries the eager path would have listed (the static list pads
        its end with −1 up to index_topk)."""
        if not self.frozen:
            raise RuntimeError("TraceBuffers.emit before freeze(): no layout yet")
        host = {dt: flat.cpu() for dt, flat in self._flat.items()}   # one device→host copy per dtype
        k = positions.size(1)
        for (kind, path, site), layout in self._layout.items():
            f = [host[dt][o:o + _numel(shape)].view(shape)[:n, :k] for dt, o, shape in layout]   # [n, k, …]
            if kind == "moe":
                trace.record_moe(path, rows, positions, *f, None)
            elif kind == "mhc":
                trace.record_mhc(path, site, rows, positions, *f)
            elif kind == "mhc_mix":
                trace.record_mhc_mix(path, site, rows, positions, *f)
            elif kind == "engram":
                trace.record_engram(path, rows, positions, *f)
            elif kind == "lens":
                trace.record_lens(path, rows, positions, *f, self.lens_readout)
            else:
                topk = f[0] if topk_width is None else f[0][..., :topk_width(path)]
                trace.record_attention(path, rows, positions, topk, *f[1:])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
