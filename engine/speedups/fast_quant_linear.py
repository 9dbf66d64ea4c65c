"""FastFP8Linear, FastFP4Linear: a quantized linear over a few rows on the CPU in one call of the C++ kernel of
engine.kernels.cpu_quant_linear, which decodes each stored code as it multiplies, instead of dequantizing the whole
weight first (what a decode step over the official checkpoint's FP8 and MXFP4 weights spends most of its time on).
Wider calls (prefills), other devices, autograd and compiled or graphed bodies run the reference forward."""
from __future__ import annotations

from functools import lru_cache

import torch

from ..kernels import cpu_quant_linear
from ..model.quant import fp8_qdq
from ..quant.formats import fp4_byte_values
from ..quant.modules import FP4Linear, FP8Linear
from .row_invariant import few_rows


@lru_cache(maxsize=1)
def code_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E4M3 value of each byte [256], E8M0 value of each byte [256], the two E2M1 values of each MXFP4 byte [512],
    low nibble first), float32, made by torch's own float8 types and engine.quant.formats: the kernel holds no
    format of its own."""
    byte = torch.arange(256, dtype=torch.uint8)
    return (byte.view(torch.float8_e4m3fn).float().contiguous(), byte.view(torch.float8_e8m0fnu).float().contiguous(),
            fp4_byte_values(torch.device("cpu")).float().reshape(-1).contiguous())


def _kernel_for(linear: FP8Linear | FP4Linear, x: torch.Tensor):
    """The built kernel when this call is a few CPU rows without autograd, outside compiled bodies; else None."""
    if not few_rows(x) or linear.weight.device.type != "cpu":
        return None
    return cpu_quant_linear.load()


def _rows(linear: FP8Linear | FP4Linear, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] → float32 rows [tokens, in], FP8-rounded first where the module asks for it (as its forward)."""
    if linear.act_quant:
        x = fp8_qdq(x)
    return x.reshape(-1, x.size(-1)).float().contiguous()                   # [tokens, in]


class FastFP8Linear(FP8Linear):
    """FP8Linear.forward up to the order of the additions, a few CPU rows in one kernel call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = _kernel_for(self, x)
        if kernel is None:
            return super().forward(x)
        codes, pow2, _ = code_tables()
        y = kernel.fp8_rows(_rows(self, x), self.weight.view(torch.uint8), self.scale.view(torch.uint8),
                            self.block[0], self.block[1], codes, pow2)     # [tokens, out]
        return y.to(x.dtype).reshape(*x.shape[:-1], y.size(-1))


class FastFP4Linear(FP4Linear):
    """FP4Linear.forward (one routed expert's matrix) up to the order of the additions, a few CPU rows in one kernel
    call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = _kernel_for(self, x)
        if kernel is None:
            return super().forward(x)
        _, pow2, pairs = code_tables()
        y = kernel.fp4_rows(_rows(self, x), self.weight.view(torch.uint8), self.scale.view(torch.uint8), pairs,
                            pow2)                                           # [tokens, out]
        return y.to(x.dtype).reshape(*x.shape[:-1], y.size(-1))
