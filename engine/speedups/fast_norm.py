"""FastRMSNorm: RMSNorm in fewer, cheaper ops (a few rows on the CPU: one C++ call; one row without it: the norm read
once; else torch's fused op)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels import cpu_norm
from ..model.norm import RMSNorm
from .derived import derived
from .sync_free import sync_free_active


class FastRMSNorm(RMSNorm):
    """RMSNorm.forward up to float rounding: weight · x · rsqrt(mean(x²) + eps). A few rows on the CPU (at most
    KERNEL_ROWS: a decode step's norms, a DSpark verify block's or draft block's) are one call of the C++ kernel of
    engine.kernels.cpu_norm (fp32 or bf16; torch's fused rms_norm costs several times as much at these sizes), each
    row the same arithmetic whatever the call's width, so a verify block's rows round as decode steps' do; not
    under sync_free() (compiled or graphed bodies), as the kernel is opaque to dynamo. Where it did not build, one
    row reads ‖x‖ once and scales by the host-side factor (three cheap ops in fp32; not under sync_free() either,
    as it reads a value back). Everything else is F.rms_norm, which computes in fp32 and casts back as the
    reference does (bit-equal on CPU). With autograd on, the reference code runs."""
    # γ + 1 with the shipped configs' γ = 5: wider calls (prefills) keep torch's op, whose bits are the reference's
    # (the kernel's differ by rounding, which under FP8 activation rounding can move a value by a whole FP8 step)
    KERNEL_ROWS = 6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return super().forward(x)
        n = x.size(-1)
        if x.device.type != "cpu" or w.dtype != x.dtype or sync_free_active():
            return F.rms_norm(x, w.shape, w, self.eps)
        kernel = cpu_norm.load() if (x.dtype in (torch.float32, torch.bfloat16) and x.is_contiguous()
                                     and 0 < x.numel() <= self.KERNEL_ROWS * n) else None
        if kernel is not None:
            return kernel.rms_norm_rows(x, self._weight_fp32(), self.eps)
        if x.numel() != n:
            return F.rms_norm(x, w.shape, w, self.eps)
        if x.dtype in (torch.float32, torch.float64):
            norm = torch.linalg.vector_norm(x).item()
            return x * (1.0 / math.sqrt(norm * norm / n + self.eps)) * w
        # bf16 / fp16: the math in fp32, as the reference does it
        norm = torch.linalg.vector_norm(x, dtype=torch.float32).item()
        return (x.float() * (1.0 / math.sqrt(norm * norm / n + self.eps)) * self._weight_fp32()).to(x.dtype)

    def _weight_fp32(self) -> torch.Tensor:
        """The weight in fp32: itself, or a copy kept beside the module and rebuilt when the weight changes."""
        w = self.weight
        return w if w.dtype == torch.float32 else derived(self).get("weight", (w,), w.float)
