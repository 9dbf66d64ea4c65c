"""FastGate: the router without a division by a temperature of 1 and with its weight's fp32 copy kept once."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.moe import Gate
from ..model.norm import upcast
from .derived import derived
from .row_invariant import few_rows_linear, lanewise


class FastGate(Gate):
    """Gate.forward, equal to it bit for bit: x / 1 is x, and a bf16 weight's fp32 copy is made once (rebuilt when
    the weight changes) instead of on every call;
    a few CPU rows go through engine.speedups.row_invariant. With autograd on, the reference code runs."""

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None, steer: torch.Tensor | None = None):
        w = self.weight
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return super().forward(x, vision, steer)
        if w.dtype not in (torch.float32, torch.float64):
            w = derived(self).get("weight", (w,), w.float)
        logits = few_rows_linear(upcast(x), w)                             # a decode step's rows alike at any count
        if logits is None:
            logits = F.linear(upcast(x), w)
        if self.temp != 1:
            logits = logits / self.temp
        return self.route(lanewise(F.softplus, logits).sqrt(), vision, steer)   # "sqrtsoftplus", fp32
