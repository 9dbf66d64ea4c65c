"""ModelCache: every piece of decode state (spec §6) for a fixed number of rows, with exact rollback."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..spec.errors import InputError
from ..spec.roles import family_roles
from .norm import upcast

if TYPE_CHECKING:  # the model builds its caches: named for annotations only
    from .transformer import Transformer

Rows = torch.Tensor | Sequence[int]   # cache rows: a tensor or a list of row numbers


class ModelCache:
    """Per row b (one sequence), the next position `pos[b]` and:

    * window[layer]   [R, W + margin, head_dim] ring of post-RoPE (FP8-QDQ'd) KV, slot = position % slots;
                      the `margin` spare slots keep the last `margin` positions restorable by rollback;
    * comp_kv[src]    [R, max_seq_len // ratio + 1, head_dim] compressed KV rows of each KV source
                      (the final row is a scratch slot that absorbs masked writes and is never read);
    * index_k[src]    [R, max_seq_len // ratio + 1, index_head_dim] the indexer keys of each KV source that
                      owns an indexer (V4: the CSA layers; HCA layers have none);
    * pending[key]    (kv, gate) fp32 rings [R, margin + window, width] of each gated compressor (key: its
                      layer; a V4 CSA layer's index-key compressor: "<layer>.indexer"): the compressor inputs of
                      recent tokens, from which an incomplete group is finished (window: ratio tokens, 2·ratio
                      for V4's overlapping windows, whose width is 2·head_dim);
    * engram_history  [R, max_seq_len] compressed token ids (−1 = DEAD), on the CPU.
    `pos` and `high_water` (highest position ever written + 1) live on the CPU.
    """

    def __init__(self, model: Transformer, batch_size: int, max_seq_len: int, margin: int) -> None:
        args = model.args
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        if max_seq_len < 1:
            raise InputError(f"max_seq_len must be at least 1, got {max_seq_len}")
        dev, dt = model.device, model.dtype
        self.args, self.batch_size, self.max_seq_len, self.margin = args, batch_size, max_seq_len, margin
        self.window_size = args.window_size
        self.window_slots = args.window_size + margin
        self.pos = torch.zeros(batch_size, dtype=torch.long)
        self.high_water = torch.zeros(batch_size, dtype=torch.long)
        self.window: dict[int, torch.Tensor] = {}
        self.comp_kv: dict[int, torch.Tensor] = {}
        self.index_k: dict[int, torch.Tensor] = {}
        self.pending: dict[int | str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pending_window: dict[int | str, tuple[int, int]] = {}   # key → (ratio, tokens of earlier windows read)
        self.ratio: dict[int, int] = {}
        family = family_roles(args)
        fdt = upcast(torch.empty(0, dtype=dt)).dtype
        for role in args.roles[: args.n_layers]:
            self.window[role.layer] = torch.zeros(batch_size, self.window_slots, args.head_dim, dtype=dt, device=dev)
            if role.kv_mode == "own":
                r = role.ratio
                n = max_seq_len // r + 1
                self.ratio[role.layer] = r
                self.comp_kv[role.layer] = torch.zeros(batch_size, n, args.head_dim, dtype=dt, device=dev)
                if role.indexer == "own":
                    self.index_k[role.layer] = torch.zeros(batch_size, n, args.index_head_dim, dtype=dt, device=dev)
                overlap = r == family.overlap_ratio
                if r > 1 or family.ape:
                    self._add_pending(role.layer, r, overlap, args.head_dim, margin, fdt)
                if role.indexer == "own" and family.key_compressor:  # V4: the index keys' own compressor
                    self._add_pending(f"{role.layer}.indexer", r, overlap, args.index_head_dim, margin, fdt)
        self.engram_history = torch.zeros(batch_size, max_seq_len, dtype=torch.long) if args.has_engram else None

    def _add_pending(self, key, ratio: int, overlap: bool, head_dim: int, margin: int, dtype) -> None:
        width, earlier = (2 * head_dim, ratio) if overlap else (head_dim, 0)
        ring = (self.batch_size, margin + ratio + earlier, width)
        dev = next(iter(self.window.values())).device
        self.pending[key] = (torch.zeros(ring, dtype=dtype, device=dev), torch.zeros(ring, dtype=dtype, device=dev))
        self.pending_window[key] = (ratio, earlier)

    # ---- bookkeeping ------------------------------------------------------------------------------
    def resolve_rows(self, rows: Rows | None, n: int) -> torch.Tensor:
        """Cache rows for a batch of n sequences (default 0..n−1), validated, as a CPU LongTensor."""
        if rows is None:
            if n > self.batch_size:
                raise InputError(f"batch of {n} sequences does not fit a cache of {self.batch_size} rows")
            return torch.arange(n)
        rows = torch.as_tensor(rows, dtype=torch.long).flatten().cpu()
        if rows.numel() != n:
            raise InputError(f"rows names {rows.numel()} cache rows for a batch of {n} sequences")
        if rows.numel() and (rows.min() < 0 or rows.max() >= self.batch_size):
            raise InputError(f"rows {rows.tolist()} outside the cache's 0..{self.batch_size - 1}")
        if rows.unique().numel() != rows.numel():
            raise InputError(f"rows {rows.tolist()} repeat a cache row")
        return rows

    def check_room(self, rows: torch.Tensor, n_tokens: int) -> None:
        end = self.pos[rows] + n_tokens
        if (end > self.max_seq_len).any():
            b = int(end.argmax())
            raise InputError(f"sequence in cache row {int(rows[b])} would reach {int(end[b])} tokens, beyond the "
                             f"cache limit max_seq_len={self.max_seq_len} (create the cache with a larger max_seq_len)")

    def advance(self, rows: torch.Tensor, n_tokens: int) -> None:
        self.pos[rows] += n_tokens
        self.high_water[rows] = torch.maximum(self.high_water[rows], self.pos[rows])

    def rollback(self, pos: int | torch.Tensor, rows: Rows | None = None) -> None:
        """Return rows to position `pos` (int or per-row tensor): the state becomes exactly what it was
        when those rows were last at that position. Only the last `margin` positions are restorable."""
        rows = (torch.arange(self.batch_size) if rows is None
                else self.resolve_rows(rows, len(torch.as_tensor(rows).flatten())))
        target = torch.as_tensor(pos, dtype=torch.long).cpu().expand(rows.shape).clone()
        cur, hw = self.pos[rows], self.high_water[rows]
        for b, r in enumerate(rows.tolist()):
            t = int(target[b])
            if t < 0 or t > int(cur[b]):
                raise InputError(f"cannot roll cache row {r} back to position {t}: it is at {int(cur[b])}")
            if t < int(hw[b]) - self.margin:
                raise InputError(f"cannot roll cache row {r} back to position {t}: only the last {self.margin} "
                                 f"positions (rollback_margin) below {int(hw[b])} are kept restorable")
        for b, r in enumerate(rows.tolist()):
            t, top = int(target[b]), int(hw[b])
            for src, ratio in self.ratio.items():  # rows that no longer exist read as never written
                end = min(top // ratio + 1, self.comp_kv[src].size(1) - 1)
                self.comp_kv[src][r, t // ratio:end] = 0
                if src in self.index_k:
                    self.index_k[src][r, t // ratio:end] = 0
            if self.engram_history is not None:
                self.engram_history[r, t:top] = 0
        self.pos[rows] = target

    def reset(self, rows: Rows | None = None) -> None:
        """Empty rows completely (a new sequence starts there)."""
        rows = torch.arange(self.batch_size) if rows is None else torch.as_tensor(rows, dtype=torch.long).flatten()
        for t in (*self.window.values(), *self.comp_kv.values(), *self.index_k.values()):
            t[rows] = 0
        for kv, gate in self.pending.values():
            kv[rows], gate[rows] = 0, 0
        if self.engram_history is not None:
            self.engram_history[rows] = 0
        self.pos[rows], self.high_water[rows] = 0, 0

    # ---- inspection -------------------------------------------------------------------------------
    def window_positions(self, row: int) -> list[int]:
        """Positions whose window KV a query at the row's next position can read, oldest first."""
        p = int(self.pos[row])
        return list(range(max(0, p - self.window_size + 1), p))

    def live_state(self, row: int) -> dict[str, torch.Tensor]:
        """Everything later tokens of this row can read, addressed by position (ring slots resolved).
        Two caches whose live states are equal give identical outputs for any continuation."""
        p = int(self.pos[row])
        out = {"pos": self.pos[row].clone()}
        for layer, ring in self.window.items():
            slots = torch.tensor([t % self.window_slots for t in self.window_positions(row)], dtype=torch.long)
            out[f"window.{layer}"] = ring[row, slots.to(ring.device)]
        for src, r in self.ratio.items():
            out[f"comp_kv.{src}"] = self.comp_kv[src][row, : p // r]
            if src in self.index_k:
                out[f"index_k.{src}"] = self.index_k[src][row, : p // r]
        for key, (kv, gate) in self.pending.items():
            r, earlier = self.pending_window[key]
            lead = p % r + min(earlier, p - p % r)  # tokens of the unfinished group (and the window before it)
            slots = torch.tensor([t % kv.size(1) for t in range(p - lead, p)], dtype=torch.long)
            out[f"pending_kv.{key}"] = kv[row, slots]
            out[f"pending_gate.{key}"] = gate[row, slots]
        if self.engram_history is not None:
            out["engram_history"] = self.engram_history[row, :p]
        return out

    def nbytes(self) -> int:
        tensors = [*self.window.values(), *self.comp_kv.values(), *self.index_k.values(),
                   *(t for pair in self.pending.values() for t in pair)]
        if self.engram_history is not None:
            tensors.append(self.engram_history)
        return sum(t.numel() * t.element_size() for t in tensors)
