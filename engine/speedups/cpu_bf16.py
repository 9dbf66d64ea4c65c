"""bf16 matrix products on a CPU without bf16 matrix instructions (neither AVX512-BF16 nor AMX): there torch's bf16
kernels get slower than fp32 ones by a growing factor once a product has more than one row (a prefill, a verify
block, the MoE's dense path). Widening both operands to fp32 gives the same products (every bf16 value is exact in
fp32) summed in fp32, as torch's bf16 kernels sum them, then one rounding to bf16: equal up to summation order.
One-row products (plain decode) keep the bf16 kernel, which beats widening the weight on every call."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

WIDEN_FROM_ROWS = 2


@functools.cache
def native_bf16_matmul() -> bool:
    """Whether this CPU has bf16 matrix instructions (torch's own probe; assumed present where torch has none)."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    probes = [probe for probe in probes if probe is not None]
    return not probes or any(probe() for probe in probes)


def widens(x: torch.Tensor, w: torch.Tensor) -> bool:
    """x [..., K] @ w in fp32: both bf16 on a CPU without bf16 matrix instructions, x with at least 2 rows."""
    return (x.dtype == w.dtype == torch.bfloat16 and x.device.type == "cpu"
            and x.numel() >= WIDEN_FROM_ROWS * x.size(-1) and not native_bf16_matmul())


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) (x [..., K], w [N, K]), widened to fp32 where that is faster (widens)."""
    return F.linear(x.float(), w.float()).to(x.dtype) if widens(x, w) else F.linear(x, w)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N], widened to fp32 where that is faster (widens)."""
    return torch.mm(a.float(), b.float()).to(a.dtype) if widens(a, b) else torch.mm(a, b)
