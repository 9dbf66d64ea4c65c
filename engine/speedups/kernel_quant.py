"""Kernel-backed variants of the quantized linears: the FP8 and MXFP4 GEMMs of engine.kernels run on the stored
codes and scales (spec §3.4) instead of a dequantized copy of the weight; same parameters and state dict."""
from __future__ import annotations

import torch

from ..kernels import launch_quant
from ..kernels.runtime import KERNEL_DTYPES
from ..quant.modules import FP4Linear, FP8Linear

KERNEL_BLOCK = (launch_quant.QBLOCK, launch_quant.QBLOCK)     # the FP8 kernel's weight scale blocks


def kernel_applies(linear: FP8Linear | FP4Linear, x: torch.Tensor) -> bool:
    """The kernels quantize their input to FP8 (what act_quant asks for), compute in fp32 without a backward,
    and read the input from the weight's device; anything else runs the PyTorch forward."""
    if not linear.act_quant or x.dtype not in KERNEL_DTYPES or x.device != linear.weight.device:
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)


class KernelFP8Linear(FP8Linear):
    """FP8Linear whose forward is act_quant + the block-scaled FP8 GEMM (two launches) for [32, 32] scale blocks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(self.block) != KERNEL_BLOCK or not kernel_applies(self, x):
            return super().forward(x)
        return launch_quant.fp8_linear(x, self.weight, self.scale)


class KernelFP4Linear(FP4Linear):
    """FP4Linear (one routed expert's matrix) whose forward is act_quant + the MXFP4 GEMM, nibbles unpacked in
    the kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not kernel_applies(self, x):
            return super().forward(x)
        return launch_quant.fp4_linear(x, self.weight, self.scale)
