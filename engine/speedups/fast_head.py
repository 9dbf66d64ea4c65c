"""FastTransformer: the vocabulary head read from an fp32 copy kept once, not converted on every forward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.linear import Linear
from ..model.transformer import Transformer
from .casts import cast
from .derived import derived
from .fast_linear import FastLinear
from .row_invariant import few_rows_linear

# On the CPU, an fp32 (or float64) head's calls of at most this many rows (decode, a DSpark verify block or draft)
# read a transposed copy [dim, V], a few rows per matmul: MKL's x @ Wᵀ over the [V, dim] head runs 3-6× slower
# for one to three rows, and its many-row kernel as slow from four rows on (measured on a 2-core AMD EPYC at
# V = 13,886). A bf16 head's fp32 copy is kept transposed for all its calls on the CPU (one copy, not two). Equal
# to F.linear up to float rounding (another summation order).
FEW_ROWS, ROWS_PER_MATMUL = 8, 3


class FastTransformer(Transformer):
    """Transformer.vocab_logits computes the logits in fp32 (the reference keeps its head in fp32); a bf16 model
    would convert its [V, dim] head on every step (at a 129k vocabulary most of a small model's decode step).
    Here the fp32 copy is made once and rebuilt only when the head changes: on a GPU the same logits, bit for bit;
    on the CPU the copy is transposed (FEW_ROWS), as an fp32 head's few-row calls read theirs where the row-invariant
    kernel (engine.speedups.row_invariant, which reads the head itself) did not build."""

    def vocab_logits(self, x: torch.Tensor) -> torch.Tensor:
        head = self.head
        out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        if type(head) not in (Linear, FastLinear) or (torch.is_grad_enabled() and head.weight.requires_grad):
            return super().vocab_logits(x)
        rows = x.numel() // x.size(-1)
        logits = few_rows_linear(cast(x, out_dtype), head.weight, out_dtype)   # a decode step, a DSpark block
        if logits is not None:                     # (engine.speedups.row_invariant: rows alike at any count)
            return logits
        few = rows <= FEW_ROWS and x.device.type == "cpu"
        if head.weight.dtype == out_dtype and not few:
            return super().vocab_logits(x)
        if x.device.type != "cpu":
            weight = derived(head).get("weight", (head.weight,), lambda: head.weight.to(out_dtype))
            return F.linear(cast(x, out_dtype), weight)
        # the CPU: a transposed copy (a bf16 head's only copy, whatever the rows)
        w_t = derived(head).get("weight_t", (head.weight,), lambda: head.weight.t().to(out_dtype).contiguous())
        flat = cast(x.reshape(rows, -1), out_dtype)                                 # [rows, dim]; w_t [dim, V]
        if not few or rows <= ROWS_PER_MATMUL:
            return (flat @ w_t).view(*x.shape[:-1], -1)
        out = torch.cat([flat[i:i + ROWS_PER_MATMUL] @ w_t for i in range(0, rows, ROWS_PER_MATMUL)])
        return out.view(*x.shape[:-1], -1)                                          # [..., V]
