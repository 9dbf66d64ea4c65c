"""RMSNorm (spec §3.1), its weightless form, and the compute-dtype rule shared by the model's numerics."""
from __future__ import annotations

import torch
from torch import nn


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp32 for bf16/fp16/fp32 tensors; float64 stays float64 (used by the exactness tests)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMS normalisation over the last dim (V4's per-head query norm), math in fp32."""
    xf = upcast(x)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (upcast(self.weight) * y).to(x.dtype)  # weight multiply in fp32, then back
