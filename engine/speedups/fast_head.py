"""FastTransformer: the vocabulary head read from an fp32 copy kept once, not converted on every forward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.linear import Linear
from ..model.transformer import Transformer
from .derived import derived
from .fast_linear import FastLinear


class FastTransformer(Transformer):
    """Transformer.vocab_logits computes the logits in fp32 (the reference keeps its head in fp32); a bf16 model
    would convert its [V, dim] head on every step (at a 129k vocabulary most of a small model's decode step).
    Here the fp32 copy is made once and rebuilt only when the head changes; same logits."""

    def vocab_logits(self, x: torch.Tensor) -> torch.Tensor:
        head = self.head
        out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        if type(head) not in (Linear, FastLinear) or head.weight.dtype == out_dtype or (
                torch.is_grad_enabled() and head.weight.requires_grad):
            return super().vocab_logits(x)
        weight = derived(head).get("weight", (head.weight,), lambda: head.weight.to(out_dtype))
        return F.linear(x if x.dtype == out_dtype else x.to(out_dtype), weight)
