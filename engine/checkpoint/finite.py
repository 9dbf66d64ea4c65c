"""Finite weights or a refusal: NaN / Inf in float tensors, the NaN codes of FP8 and E8M0, and E8M0 scales so large
that their block overflows float32 when dequantized. One min/max pass per tensor (~1 ms per 10^7 values)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .errors import CheckpointError

# Bit patterns with no finite value, as (largest finite uint8 view, largest finite int8 view): a code above either
# is NaN or Inf. E4M3FN: 0x7F / 0xFF are NaN. E5M2: 0x7C..0x7F / 0xFC..0xFF are Inf or NaN. E8M0: 0xFF is NaN.
CODE_LIMITS = {torch.float8_e4m3fn: (0xFE, 0x7E), torch.float8_e5m2: (0xFB, 0x7B), torch.float8_e8m0fnu: (0xFE, 0x7F)}
# The largest E8M0 scale code whose block still dequantizes finitely in float32, by the stored weight's dtype code:
# FP8 E4M3 reaches 448 = 1.75·2^8 and FP4 E2M1 reaches 6 = 1.5·2^2, and float32 ends below 2^128.
SCALE_CODE_LIMITS = {"F8_E4M3": 127 + 119, "I8": 127 + 125}


def check_finite(t: torch.Tensor, name: str, where: str, row_ids: Sequence[int] | None = None) -> None:
    """CheckpointError naming the tensor, `where` it is, how many values are not finite and the first of them,
    if `t` holds a NaN or Inf (float dtypes) or a NaN / Inf code (FP8, E8M0). Integer tensors always pass.
    row_ids: `t` holds these rows of the tensor (a gather), so positions are reported in the tensor's rows."""
    if t.numel() == 0 or not _has_nonfinite(t):
        return
    bad = _nonfinite_mask(t)
    first = _position(bad, t.shape, row_ids)
    kind = "code" if t.dtype in CODE_LIMITS else "value"
    raise CheckpointError(f"{where}: tensor '{name}' holds {int(bad.sum()):,} NaN or infinite {kind}(s), the first at "
                          f"{first}; the checkpoint is damaged (such weights turn the logits into NaN)")


def check_scale_range(scale: torch.Tensor, name: str, weight_code: str, where: str,
                      row_ids: Sequence[int] | None = None) -> None:
    """CheckpointError if an E8M0 `scale` of a weight stored as `weight_code` is so large that its block's
    largest code overflows float32 when dequantized (no trained weight has such a scale)."""
    limit = SCALE_CODE_LIMITS.get(weight_code)
    if limit is None or scale.numel() == 0:
        return
    codes = scale.view(torch.uint8)
    top = int(codes.max())
    if top > limit:
        first = _position(codes > limit, scale.shape, row_ids)
        raise CheckpointError(f"{where}: scale '{name}' holds 2^{top - 127} (at {first}), which makes its "
                              f"{weight_code} block overflow float32 (the largest usable scale is 2^{limit - 127}); "
                              "the checkpoint is damaged")


def _has_nonfinite(t: torch.Tensor) -> bool:
    if t.dtype in CODE_LIMITS:
        top_u8, top_i8 = CODE_LIMITS[t.dtype]
        return int(t.view(torch.uint8).max()) > top_u8 or int(t.view(torch.int8).max()) > top_i8
    if not t.is_floating_point():
        return False
    low, high = torch.aminmax(t)   # NaN propagates to both; an Inf is the min or the max
    return not (math.isfinite(low.item()) and math.isfinite(high.item()))


def _nonfinite_mask(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in CODE_LIMITS:
        top_u8, top_i8 = CODE_LIMITS[t.dtype]
        return (t.view(torch.uint8) > top_u8) | (t.view(torch.int8) > top_i8)
    return ~torch.isfinite(t)


def _position(mask: torch.Tensor, shape: torch.Size, row_ids: Sequence[int] | None) -> list[int]:
    """The index of the first True of `mask` (of that shape); its row translated through row_ids if given."""
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    first = [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)] if len(shape) else []
    if row_ids is not None and first:
        first[0] = int(row_ids[first[0]])
    return first
