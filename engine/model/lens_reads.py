"""The logit lens's read-outs and stream RMS of one forward, handed to the trace: a layer at a time, or for a one-token
step all layers at once after the last (RMS batched; V4.1's collapse batched too, and the rest of the read-out left to
the trace, which applies it row by row when it resolves the lens, so every value keeps the bits of the per-layer
path)."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from .context import ForwardContext
from .mhc import collapse
from .norm import upcast

if TYPE_CHECKING:  # the model reads its lens through this module: named for annotations only
    from .transformer import Transformer

# A V4 step keeps each layer's streams for the trace (hc·dim values each, where V4.1 keeps a collapse of dim) only up
# to this many values per layer and token: 16 KB, a dim-4096 V4.1 collapse; wider V4 streams are read out layer by
# layer, so that the lens's held bytes stay what they were.
KEPT_STREAM_VALUES = 4096


def stream_rms(h: torch.Tensor) -> torch.Tensor:
    """Each hc stream's RMS: h [..., hc, dim] → [..., hc] fp32."""
    return torch.linalg.vector_norm(upcast(h), dim=-1) * h.size(-1) ** -0.5


def streams_readout(model: Transformer, streams: torch.Tensor) -> torch.Tensor:
    """V4's read-out of recorded streams [n, hc, dim] → [n, dim]: its learned hc_head, then the final norm (the
    trace calls it with one row at a time, the shapes of a one-token step's read-out)."""
    return model.readout(streams.unsqueeze(1), None).squeeze(1)


class LensReads:
    """Made by Transformer.run_layers when its trace records the lens: add() after each layer, finish() for the
    logits' input. A call of one token on the CPU (fp32, eager) keeps each recorded layer's streams (a few KB) until
    finish(), which hands them all over in a few ops instead of about ten per layer: V4.1's collapsed (one op for
    all layers), V4's as they are (its hc_head and final norm run when the trace is read; KEPT_STREAM_VALUES)."""

    def __init__(self, model: Transformer, n_tokens: int, ctx: ForwardContext) -> None:   # n_tokens: B·S
        self.model = model
        a = model.args
        self.batched = (n_tokens == 1 and ctx.hands_lens_unread() and model.dtype == torch.float32 and
                        model.device.type == "cpu" and
                        (not model.family.hc_head or a.hc_mult * a.dim <= KEPT_STREAM_VALUES))
        self.layers: list[tuple] = []   # batched: (path, h_in, h, pre) of each recorded layer
        self.last: tuple | None = None   # per layer: the last recorded layer's (h, read-out)
        self.rms: tuple | None = None    # per layer: the last streams' (h, RMS): a layer's input is the last output

    def add(self, path: str, h_in: torch.Tensor, h: torch.Tensor, pre: torch.Tensor, ctx: ForwardContext) -> None:
        """After a layer: its input and output streams h_in, h [B, S, hc, dim] and the pre h is read out with."""
        if not ctx.trace.wants_lens(path):
            return
        if self.batched:
            self.layers.append((path, h_in, h, pre))
            return
        x = self.model.readout(h, pre)
        rows, pos = ctx.trace_rows()
        ctx.trace.record_lens(path, rows, pos, x, self._rms(h_in), self._rms(h), self.model.lens_logits)
        self.last = (h, x)

    def finish(self, h: torch.Tensor, pre: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The read-out of the last layer's streams h [B, S, hc, dim] (the logits' input), after the batched
        layers are recorded; where the lens read out that layer, its own read-out."""
        if not self.batched:
            return self.last[1] if self.last is not None and self.last[0] is h else self.model.readout(h, pre)
        if not self.layers:
            return self.model.readout(h, pre)
        paths, ins, outs, pres = zip(*self.layers)
        if self.model.family.hc_head:   # each layer's streams [1, 1, hc, dim] as they are, read out by the trace
            unread, finish = outs, partial(streams_readout, self.model)
        else:                           # the collapse [1, 1, dim] of each (one op for all), normed by the trace
            unread, finish = collapse(torch.cat(outs), torch.cat(pres)).unsqueeze(1).unbind(0), self.model.norm
        streams = list({id(t): t for t in (*ins, *outs)}.values())              # each distinct [1, 1, hc, dim] once
        at = {id(t): k for k, t in enumerate(streams)}
        rms = stream_rms(torch.cat(streams)).unsqueeze(1).unbind(0)             # [1, 1, hc] each
        rows, pos = ctx.trace_rows()
        trace, head = ctx.trace, self.model.lens_logits
        for path, h_in, h_out, x in zip(paths, ins, outs, unread):
            trace.record_lens(path, rows, pos, x, rms[at[id(h_in)]], rms[at[id(h_out)]], head, finish)
        if outs[-1] is h and not self.model.family.hc_head:
            return self.model.norm(unread[-1])
        return self.model.readout(h, pre)

    def _rms(self, h: torch.Tensor) -> torch.Tensor:
        if self.rms is None or self.rms[0] is not h:
            self.rms = (h, stream_rms(h))
        return self.rms[1]
