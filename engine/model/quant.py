"""FP8 / FP4 quant-dequant emulation of the reference kernels (spec §3.2–3.3), elementwise per block."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from ..spec.errors import InputError

FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive E2M1 magnitudes; at an exact tie round-to-nearest-even goes up only
# where the upper code is even (0.75 → 1, 1.75 → 2, 3.5 → 4).
E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_TIE_UP = (False, True, False, True, False, True, False)


def pow2_scale(amax: torch.Tensor, max_value: float) -> torch.Tensor:
    """2^ceil(log2(amax / max_value)) via the IEEE bit trick of the kernel (exponent + (mantissa != 0))."""
    # the kernel multiplies by the fp32-rounded reciprocal
    x = (amax.float() * float(np.float32(1.0 / max_value))).contiguous()
    bits = x.view(torch.int32)
    log2_ceil = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((log2_ceil + 127) << 23).view(torch.float32)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest float8 e4m3 value (ties to even), saturating at ±448; same dtype out."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype)


@lru_cache(maxsize=16)
def _e2m1_tables(dtype: torch.dtype, device: torch.device):
    return (torch.tensor(E2M1_MIDS, dtype=dtype, device=device), torch.tensor(E2M1_GRID, dtype=dtype, device=device),
            torch.tensor(E2M1_TIE_UP, device=device))


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """v in [-6, 6] → nearest E2M1 value (ties to even code), sign (and −0) preserved; NaN stays NaN (for the
    engine's non-finite checks to find)."""
    grid = _e2m1_tables(v.dtype, v.device)[1]
    return torch.where(v.isnan(), v, torch.copysign(grid[e2m1_magnitude(v)], v))


def e2m1_magnitude(v: torch.Tensor) -> torch.Tensor:
    """v in [-6, 6] → the index (0..7, int64) into E2M1_GRID of |v|'s nearest value, ties to the even code.
    (NaN gives index 0: a NaN has no nearest value, and an index must stay in the table.)
    The grid is three evenly spaced runs, 0..2 by 0.5 (codes 0..4), 2..4 by 1 (4..6) and 4..6 by 2 (6..7): in
    each, |v| scaled by a power of two (exact) rounds half to even (torch.round) to its step, and an even offset
    (which keeps ties even) gives the code. The rounding adds and subtracts 2^mantissa bits (exact, and
    vectorized: torch.round takes milliseconds per call on small CPU tensors)."""
    wide = torch.float64 if v.dtype == torch.float64 else torch.float32   # bf16 / fp16 values are exact in fp32
    mag = v.abs().to(wide)
    magic = 2.0 ** (52 if wide == torch.float64 else 23)   # the mantissa bits: ulp 1 from there up

    def nearest(x: torch.Tensor) -> torch.Tensor:   # x in [0, 4]: ties to even
        return (x + magic) - magic

    code = torch.where(mag < 2, nearest(2 * mag), torch.where(mag < 4, nearest(mag) + 2, nearest(mag / 2) + 4))
    return code.nan_to_num(0.0).long()


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """[..., n] → [..., ceil(n / block), block]; a partial last block (tiny configs only) is zero-padded,
    which leaves its amax and therefore its scale unchanged."""
    xf = x if x.dtype == torch.float64 else x.float()
    if x.size(-1) % block:
        xf = F.pad(xf, (0, -x.size(-1) % block))
    return xf.unflatten(-1, (-1, block))


def _unblock(yg: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return yg.flatten(-2)[..., : x.size(-1)].to(x.dtype)


def fp8_qdq(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """act_quant 'inplace' semantics: per block of 32, scale = pow2 ≥ amax/448, e4m3 round, times scale."""
    xg = _blocks(x, block)
    amax = xg.abs().amax(-1).clamp_min(1e-4)
    s = pow2_scale(amax, FP8_MAX).to(xg.dtype).unsqueeze(-1)
    return _unblock(to_e4m3(xg / s) * s, x)


def fp4_qdq(x: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """fp4_act_quant 'inplace' semantics. scale='ue8m0' (indexer q/k, block 32) or 'e4m3' (compressed KV, block 16)."""
    xg = _blocks(x, block)
    amax = xg.abs().amax(-1)
    if scale == "e4m3":
        s = to_e4m3(amax.float().clamp_min(6 * 2.0**-9) / FP4_MAX)  # scale itself rounded to e4m3
    elif scale == "ue8m0":
        s = pow2_scale(amax.clamp_min(6 * 2.0**-126), FP4_MAX)
    else:
        raise InputError(f"unknown FP4 scale format {scale!r}; expected 'ue8m0' or 'e4m3'")
    s = s.to(xg.dtype).unsqueeze(-1)
    return _unblock(round_e2m1((xg / s).clamp(-FP4_MAX, FP4_MAX)) * s, x)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh–Hadamard transform of the last dim (Sylvester order, scaled by n^-1/2), n a power of two:
    the V4 reference's `rotate_activation`, which spreads each vector over all channels before FP4 rounding."""
    n = x.size(-1)
    y = x if x.dtype == torch.float64 else x.float()
    h = 1
    while h < n:
        y = y.unflatten(-1, (-1, 2, h))                                      # [..., n / 2h, 2, h]: pairs (j, j + h)
        y = torch.stack([y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]], -2).flatten(-3)
        h *= 2
    return (y * n ** -0.5).to(x.dtype)


def v4_kv_qdq(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """The V4 reference's simulation on window and compressed KV: FP8 (block 64) on the nope channels only; the
    rope channels stay in the activation dtype."""
    return torch.cat([fp8_qdq(kv[..., :-rope_dim], 64), kv[..., -rope_dim:]], -1)


def v4_index_qdq(x: torch.Tensor) -> torch.Tensor:
    """The V4 reference's simulation on indexer queries and keys: Hadamard rotation, then FP4 (block 32, ue8m0).
    Both sides are rotated, so scores change only by the rounding; a width that is not a power of two (tiny
    configs only) is quantized unrotated."""
    n = x.size(-1)
    return fp4_qdq(hadamard(x) if n & (n - 1) == 0 else x, 32, "ue8m0")
