"""FP8 / FP4 quant-dequant in about half the ops of engine.model.quant's, bit for bit the same values."""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from ..kernels import cpu_fp8_round
from ..model import quant
from .casts import cast

RECIP_FP8_MAX = float(torch.tensor(1.0 / quant.FP8_MAX, dtype=torch.float32))   # the kernel's fp32 reciprocals
RECIP_FP4_MAX = float(torch.tensor(1.0 / quant.FP4_MAX, dtype=torch.float32))
MANTISSA = 0x7FFFFF
EXPONENT = 0x7F800000


def pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) for positive normal fp32 v, as quant.pow2_scale's bit trick, in four ops: adding an all-ones
    mantissa carries into the exponent exactly when the mantissa is not zero; then the mantissa is cleared."""
    return ((v.view(torch.int32) + MANTISSA) & EXPONENT).view(torch.float32)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """[..., n] → [..., ceil(n / block), block] in fp32 (float64 stays); a partial last block (tiny configs only)
    is zero-padded, which leaves its amax, hence its scale and values, as they are (quant._blocks)."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if x.size(-1) % block:
        xf = F.pad(xf, (0, -x.size(-1) % block))
    return xf.unflatten(-1, (-1, block))


def _unblock(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = y.flatten(-2)
    if y.size(-1) != x.size(-1):
        y = y[..., :x.size(-1)]
    return y if y.dtype == x.dtype else y.to(x.dtype)


def fp8_qdq(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """quant.fp8_qdq (per block: scale = the power of two ≥ amax/448, e4m3 rounding, times the scale), equal to
    it bit for bit. A CPU fp32 or bf16 x whose rows are whole blocks takes the C++ kernel of
    engine.kernels.cpu_fp8_round (one call for these dozen ops)."""
    rounded = _fp8_kernel(x, block)
    if rounded is not None:
        return rounded
    xg = _blocks(x, block)                                                    # [..., n, block]
    amax = torch.linalg.vector_norm(xg, float("inf"), -1, keepdim=True).clamp_min(1e-4)   # max |x|, exact
    s = pow2_ceil(cast(amax, torch.float32) * RECIP_FP8_MAX)
    if s.dtype != xg.dtype:
        s = s.to(xg.dtype)
    return _unblock((xg / s).clamp(-quant.FP8_MAX, quant.FP8_MAX).to(torch.float8_e4m3fn).to(xg.dtype) * s, x)


def _fp8_kernel(x: torch.Tensor, block: int) -> torch.Tensor | None:
    """fp8_qdq(x, block) by the C++ kernel, or None where it does not apply (another device or dtype, a partial
    block, autograd, compiled code) or did not build."""
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or x.dim() == 0
            or x.size(-1) % block or torch.compiler.is_compiling() or (torch.is_grad_enabled() and x.requires_grad)):
        return None
    kernel = cpu_fp8_round.load()
    if kernel is None:
        return None
    y = kernel.fp8_round(x.contiguous() if x.dtype == torch.float32 else x.float().contiguous(), block, RECIP_FP8_MAX)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """quant.round_e2m1 (v in [−6, 6] → the nearest E2M1 value, ties to the even code) without its tables:
    the E2M1 grid has step 0.5 below 2, 1 below 4 and 2 up to 6, and on each stretch an even code is an even
    multiple of the step, so rounding |v| / step half-to-even (torch.round) picks the same value; the steps
    are powers of two, so the division and the product are exact."""
    mag = v.abs()
    bounds, steps = _e2m1_steps(v.dtype)
    step = steps[torch.bucketize(mag, bounds, right=True)]
    return torch.copysign(torch.round(mag / step) * step, v)


def _e2m1_steps(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the E2M1 grid's step changes (2, 4) and the step on each stretch (0.5, 1, 2), CPU tensors, made
    once per dtype (compiled code builds them into its graph instead)."""
    return _steps(dtype) if torch.compiler.is_compiling() else _cached_steps(dtype)


def _steps(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([2.0, 4.0], dtype=dtype), torch.tensor([0.5, 1.0, 2.0], dtype=dtype)


_cached_steps = lru_cache(maxsize=4)(_steps)


def fp4_qdq(x: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """quant.fp4_qdq, bit for bit: scale='ue8m0' (the power of two ≥ amax/6) or 'e4m3' (amax/6 rounded to
    e4m3), E2M1 rounding, times the scale. A device other than the CPU (the small tables above live there)
    takes the reference."""
    if x.device.type != "cpu" or scale not in ("ue8m0", "e4m3"):
        return quant.fp4_qdq(x, block, scale)
    xg = _blocks(x, block)                                                    # [..., n, block]
    amax = cast(torch.linalg.vector_norm(xg, float("inf"), -1, keepdim=True), torch.float32)   # max |x|, exact
    if scale == "e4m3":
        s = quant.to_e4m3(amax.clamp_min(6 * 2.0**-9) / quant.FP4_MAX)
    else:
        s = pow2_ceil(amax.clamp_min(6 * 2.0**-126) * RECIP_FP4_MAX)
    if s.dtype != xg.dtype:
        s = s.to(xg.dtype)
    return _unblock(round_e2m1((xg / s).clamp(-quant.FP4_MAX, quant.FP4_MAX)) * s, x)


def v4_kv_qdq(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """quant.v4_kv_qdq: FP8 (block 64) on the nope channels, the rope channels as they are."""
    return torch.cat([fp8_qdq(kv[..., :-rope_dim], 64), kv[..., -rope_dim:]], -1)


def v4_index_qdq(x: torch.Tensor) -> torch.Tensor:
    """quant.v4_index_qdq: Hadamard rotation (a power-of-two width), then FP4 (block 32, ue8m0)."""
    n = x.size(-1)
    return fp4_qdq(hadamard(x) if n & (n - 1) == 0 else x, 32, "ue8m0")


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """quant.hadamard (orthonormal Walsh–Hadamard transform of the last dim, n a power of two) as one matmul with
    the ±1 matrix of the same transform, then the same n^-1/2: equal up to the order of the sums (the reference
    runs log2 n butterfly stages of adds and subtracts, ~8 ops each)."""
    n = x.size(-1)
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return cast(torch.matmul(xf, _signs(n, xf.dtype, xf.device)) * n ** -0.5, x.dtype)


def _signs(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ±1 matrix H with quant.hadamard(x) = (x @ H) · n^-1/2: the reference transform of the identity,
    rescaled (exact in float64), made once per size, dtype and device (compiled code builds it in its graph)."""
    if torch.compiler.is_compiling():
        return _sign_matrix(n).to(device, dtype)
    return _cached_signs(n, dtype, device)


def _sign_matrix(n: int) -> torch.Tensor:
    return (quant.hadamard(torch.eye(n, dtype=torch.float64)) * n ** 0.5).round()


@lru_cache(maxsize=8)
def _cached_signs(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return _sign_matrix(n).to(device, dtype)
