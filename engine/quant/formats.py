"""The official checkpoint's storage formats (spec §2.2): FP8 E4M3 weights with E8M0 block scales, MXFP4
routed-expert weights packed two per byte, and Engram rows with one E8M0 scale per 32 channels.

Pure tensor functions, both ways: quantize (what `engine quantize` writes) and dequantize (what a loaded
model multiplies with). Scales are powers of two stored as E8M0 codes: value = 2^(code − 127)."""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from ..model.quant import E2M1_GRID, FP4_MAX, FP8_MAX, e2m1_magnitude
from ..spec.errors import InputError

FP8_BLOCK = 32        # dense FP8 weights: one scale per [32, 32] block
FP4_BLOCK = 32        # routed experts: one scale per 32 consecutive inputs of a row
ENGRAM_BLOCK = 32     # Engram tables: one scale per 32 channels of a row


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (torch.float8_e8m0fnu) → their float32 values 2^(code − 127)."""
    if scale.dtype != torch.float8_e8m0fnu:
        raise InputError(f"an E8M0 scale must have dtype float8_e8m0fnu, got {scale.dtype}")
    return scale.float()


def weight_scale(amax: torch.Tensor, max_value: float) -> torch.Tensor:
    """The smallest power of two p with amax ≤ max_value · p, exactly (float32). Unlike the activation kernel's
    rounded-reciprocal trick, this makes quantizing an already dequantized weight give back the same codes."""
    p = torch.exp2(torch.ceil(torch.log2(amax.float() / max_value)))
    p = torch.where(amax <= max_value * p / 2, p / 2, p)                     # log2 rounded up one too far
    return torch.where(amax > max_value * p, p * 2, p)                       # or one too short


def _padded(w: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor up to multiples of (rows, cols); padding leaves every block's amax unchanged."""
    return F.pad(w, (0, -w.size(1) % cols, 0, -w.size(0) % rows))


def quantize_fp8(w: torch.Tensor, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] → (float8_e4m3fn [out, in], E8M0 scale [ceil(out/b0), ceil(in/b1)]); each block's scale is the
    smallest power of two that brings its largest magnitude within ±448."""
    if w.dim() != 2:
        raise InputError(f"quantize_fp8 takes a 2-D weight, got shape {tuple(w.shape)}")
    out, inp = w.shape
    b0, b1 = block
    wp = _padded(w.float(), b0, b1)
    blocks = wp.unflatten(0, (-1, b0)).unflatten(2, (-1, b1))               # [out/b0, b0, in/b1, b1]
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-30)                    # [out/b0, in/b1]
    scale = weight_scale(amax, FP8_MAX)                                      # powers of two, float32
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).flatten(2).flatten(0, 1)
    return q[:out, :inp].to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def dequantize_fp8(w8: torch.Tensor, scale: torch.Tensor,
                   block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)) -> torch.Tensor:
    """float8_e4m3fn [out, in] and its E8M0 block scale → float32 [out, in]:
    W[o, i] = w8[o, i] · 2^(s[o//b0, i//b1] − 127)."""
    out, inp = w8.shape
    b0, b1 = block
    want = (-(-out // b0), -(-inp // b1))
    if tuple(scale.shape) != want:
        raise InputError(f"an FP8 weight of shape {(out, inp)} needs a scale of shape {want}, got {tuple(scale.shape)}")
    s = e8m0_to_float(scale).repeat_interleave(b0, 0)[:out].repeat_interleave(b1, 1)[:, :inp]
    return w8.float() * s


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] (in even) → (int8 [out, in/2], E8M0 scale [out, ceil(in/32)]) in OCP MXFP4: each byte holds
    two E2M1 codes, the low nibble element 2j and the high nibble element 2j+1; code = sign bit 3, magnitude
    index into (0, 0.5, 1, 1.5, 2, 3, 4, 6)."""
    if w.dim() != 2 or w.size(1) % 2:
        raise InputError(f"quantize_fp4 takes a 2-D weight with an even number of columns, got {tuple(w.shape)}")
    out, inp = w.shape
    groups = _padded(w.float(), 1, FP4_BLOCK).unflatten(1, (-1, FP4_BLOCK))  # [out, in/32, 32]
    scale = weight_scale(groups.abs().amax(-1).clamp_min(1e-30), FP4_MAX)   # [out, in/32]
    v = (groups / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX).flatten(1)[:, :inp]   # [out, in]
    codes = e2m1_magnitude(v) | (torch.signbit(v).long() << 3)               # [out, in] 0..15: magnitude, sign
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)                          # [out, in/2] 0..255
    return packed.to(torch.uint8).view(torch.int8), scale.to(torch.float8_e8m0fnu)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """int8 [out, in/2] MXFP4 bytes → float32 [out, in] E2M1 values (before scaling): each byte's two values read
    from a 256-row table (one row gather; decoding the nibbles elementwise is ~7× slower on the CPU)."""
    if packed.dtype != torch.int8:
        raise InputError(f"packed FP4 weights are int8 (two E2M1 codes per byte), got {packed.dtype}")
    table = fp4_byte_values(packed.device)                                      # [256, 2]
    rows = table.index_select(0, packed.view(torch.uint8).reshape(-1).long())  # [out·in/2, 2]: low nibble first
    return rows.view(*packed.shape[:-1], 2 * packed.size(-1))


@lru_cache(maxsize=8)
def fp4_byte_values(device: torch.device) -> torch.Tensor:
    """[256, 2] float32: the E2M1 values of each byte's low and high nibble (bit 3 of a nibble is the sign)."""
    codes = torch.arange(256)
    nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1)                 # [256, 2]
    values = torch.tensor(E2M1_GRID)[nibbles & 7]
    return torch.where(nibbles & 8 != 0, -values, values).to(device)


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 [out, in/2] and E8M0 scale [out, ceil(in/32)] → float32 [out, in]:
    W[o, i] = e2m1 · 2^(s[o, i//32] − 127)."""
    out, half = packed.shape
    want = (out, -(-2 * half // FP4_BLOCK))
    if tuple(scale.shape) != want:
        raise InputError(f"an FP4 weight of shape {(out, 2 * half)} needs a scale of shape {want}, "
                         f"got {tuple(scale.shape)}")
    values = unpack_fp4(packed)
    if values.size(1) % FP4_BLOCK:   # a partial last block (tiny configs): the scale spread over every column
        return values * e8m0_to_float(scale).repeat_interleave(FP4_BLOCK, 1)[:, : 2 * half]
    return (values.unflatten(1, (-1, FP4_BLOCK)) * e8m0_to_float(scale).unsqueeze(-1)).flatten(1)  # [out, in/32, 32]


def quantize_engram_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An Engram table [rows, head_dim] → (float8_e4m3fn [rows, head_dim], E8M0 scale [rows, head_dim/32])."""
    return quantize_fp8(table, (1, ENGRAM_BLOCK))


def dequantize_engram_rows(rows8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Gathered Engram rows [..., head_dim] (float8_e4m3fn) and their scales [..., head_dim/32] → float32."""
    s = e8m0_to_float(scale).repeat_interleave(ENGRAM_BLOCK, -1)[..., : rows8.size(-1)]
    return rows8.float() * s
