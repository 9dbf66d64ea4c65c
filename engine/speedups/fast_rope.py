"""RoPE as one matmul: a per-position rotation matrix over the whole head, built once per call and rotary kind."""
from __future__ import annotations

from functools import lru_cache

import torch

from ..model.rope import Rotary

# Rotation matrices are [B, S, D, D]: worth building for a decode or verify call, not for a long prefill.
MAX_ROTATED_POSITIONS = 16


def rotation(ctx, rotary: Rotary, width: int) -> torch.Tensor:
    """M [B, S, width, width] (fp32) with x @ M = engine.model.rope.apply_rope(x, rotary.cis(ctx.positions)) for
    x [B, S, (H,) width]: identity on the leading width − rope_dim channels, and on each pair (x₀, x₁) of the
    last rope_dim the rotation by θ = pos · freq (x₀ cos θ − x₁ sin θ, x₀ sin θ + x₁ cos θ). Its transpose
    rotates back (apply_rope's inverse). Built once per call, rotary kind and width (ctx.memo)."""
    return ctx.cached(("rotation", rotary.key, width), lambda: rotation_at(ctx, rotary, ctx.positions, width))


def rotation_at(ctx, rotary: Rotary, positions: torch.Tensor, width: int) -> torch.Tensor:
    """The rotation matrices [*positions.shape, width, width] of `rotary` at any positions (e.g. compressed
    groups'). cos θ and sin θ are the reference's (the real and imaginary parts of rotary.cis, shared with it
    through the call's memo at the call's positions); compiled code takes them from θ directly, as inductor
    generates no code for complex numbers."""
    if torch.compiler.is_compiling():
        ang = positions.to(rotary.freqs.device, torch.float32).unsqueeze(-1) * rotary.freqs
        return _build(ang.cos(), ang.sin(), rotary.rope_dim, width)
    if positions is not ctx.positions:
        return rotation_for(rotary, positions, width)
    cis = ctx.cached(("cis", rotary.key), lambda: rotary.cis(ctx.positions))
    return _build(cis.real, cis.imag, rotary.rope_dim, width)


def rotation_for(rotary: Rotary, positions: torch.Tensor, width: int) -> torch.Tensor:
    """The rotation matrices [*positions.shape, width, width] of `rotary` at `positions`, outside a forward call
    (nothing cached)."""
    cis = rotary.cis(positions)
    return _build(cis.real, cis.imag, rotary.rope_dim, width)


def rotation_of(ctx, cis: torch.Tensor, width: int) -> torch.Tensor:
    """The rotation matrices [B, S, width, width] of `cis` [B, S, R/2] (one of the call's cached cis tensors),
    built once per call and width."""
    return ctx.cached(("rotation", id(cis), width), lambda: _build(cis.real, cis.imag, 2 * cis.size(-1), width))


def scaled_rotation(ctx, rotary: Rotary, width: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """rotation(...) · scale in `dtype` (the query's compute dtype): rotates a query and applies the attention's
    softmax scale in the same matmul (the reference scales the logits, q·k, instead of q: a rounding difference
    only). Cached for the call."""
    return ctx.cached(("rotation", rotary.key, width, scale, dtype),
                      lambda: rotation(ctx, rotary, width).to(dtype) * scale)


def inverse_rotation(ctx, rotary: Rotary, width: int) -> torch.Tensor:
    """rotation(...)ᵀ, the rotation back (cached for the call)."""
    return ctx.cached(("rotation_t", rotary.key, width), lambda: rotation(ctx, rotary, width).transpose(-1, -2))


def _build(cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, width: int) -> torch.Tensor:
    """cos, sin [B, S, R/2] (fp32) → the rotation matrices [B, S, width, width], written into zeros at once."""
    lead = cos.shape[:-1]
    values = torch.cat([cos.new_ones(*lead, width - rope_dim), cos, cos, sin, -sin], -1)   # in _entries' order
    m = cos.new_zeros(*lead, width * width)
    m[..., _entries(width, rope_dim, cos.device)] = values
    return m.view(*lead, width, width)


def _entries(width: int, rope_dim: int, device: torch.device) -> torch.Tensor:
    """_entry_index, made once per shape and device (compiled code builds it into its graph instead)."""
    if torch.compiler.is_compiling():
        return _entry_index(width, rope_dim).to(device)
    return _cached_entries(width, rope_dim, device)


@lru_cache(maxsize=16)
def _cached_entries(width: int, rope_dim: int, device: torch.device) -> torch.Tensor:
    return _entry_index(width, rope_dim).to(device)


def _entry_index(width: int, rope_dim: int) -> torch.Tensor:
    """Flat indices (row · width + column) of a rotation matrix's non-zero entries: the identity on the leading
    width − rope_dim channels, then for each pair (x₀, x₁) = (c, c + 1) of the rest: (c, c) and (c + 1, c + 1)
    hold cos θ, (c, c + 1) holds sin θ (y₁ = x₀ sin θ + x₁ cos θ) and (c + 1, c) −sin θ (y₀ = x₀ cos θ − x₁ sin θ)."""
    nope = torch.arange(width - rope_dim)
    c = torch.arange(width - rope_dim, width, 2)
    return torch.cat([nope * (width + 1), c * (width + 1), (c + 1) * (width + 1), c * width + c + 1,
                      (c + 1) * width + c])


def rotate(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x [B, S, D] or [B, S, H, D] times its positions' rotation m [B, S, D, D] (or mᵀ to undo it), math in
    fp32 as apply_rope, back in x's dtype."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if xf.dtype != m.dtype:
        m = m.to(xf.dtype)
    out = torch.matmul(xf.unsqueeze(-2), m).squeeze(-2) if x.dim() == m.dim() - 1 else torch.matmul(xf, m)
    return out if out.dtype == x.dtype else out.to(x.dtype)
