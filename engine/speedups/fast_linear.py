"""FastLinear: Linear without the per-call no-op cast, and with the FP8 activation rounding of fast_quant."""
from __future__ import annotations

import torch

from ..model.linear import Linear
from .cpu_bf16 import linear
from .fast_quant import fp8_qdq
from .row_invariant import few_rows_linear


class FastLinear(Linear):
    """Linear.forward, equal to it bit for bit (bf16 on the CPU: up to summation order): the input is cast only
    when its dtype differs from the weight's, and a quantized weight's FP8 input quant-dequant takes
    engine.speedups.fast_quant's ops. bf16 products on the CPU run in fp32 where torch's bf16 kernels are slower, a
    small weight's through an fp32 copy kept beside the module (engine.speedups.cpu_bf16). With autograd on, the
    reference code runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return super().forward(x)
        if self.act_quant and self.quantized:
            x = fp8_qdq(x)
        y = few_rows_linear(x, w, w.dtype)
        return y if y is not None else linear(x, w, self)
