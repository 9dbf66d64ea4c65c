"""Linear with optional FP8 activation quant-dequant (the reference's dynamic activation scheme)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quant import fp8_qdq


class Linear(nn.Module):
    """y = x Wᵀ. `quantized` marks weights that are FP8/FP4 in the official checkpoint; for those,
    `act_quant` (set by the Transformer from EngineOptions) quantizes the input to FP8 first."""

    def __init__(self, in_features: int, out_features: int, *, quantized: bool = False,
                 dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.quantized = quantized
        self.act_quant = False
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_quant and self.quantized:
            x = fp8_qdq(x)
        return F.linear(x.to(self.weight.dtype), self.weight)

    def extra_repr(self) -> str:
        return f"{self.in_features} → {self.out_features}" + (", fp8" if self.quantized else "")
