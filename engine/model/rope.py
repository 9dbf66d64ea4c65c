"""Rotary embedding with YaRN (spec §3.6): interleaved pairs on the last rope_head_dim channels."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..spec.config import ModelArgs
from .norm import upcast


def rope_frequencies(rope_dim: int, base: float, original_seq_len: int, factor: float,
                     beta_fast: float, beta_slow: float) -> torch.Tensor:
    """θ_i for pair i = 0..rope_dim/2-1, fp32; YaRN blends θ/factor into the long wavelengths."""
    freqs = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    if original_seq_len > 0:
        # the pair index whose wavelength turns `rotations` times over the original context
        def corr(rotations: float) -> float:
            return rope_dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), rope_dim - 1)
        ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        freqs = freqs / factor * ramp + freqs * (1 - ramp)
    return freqs


class Rotary(nn.Module):
    """One layer's rotation: base 10000 without YaRN for window-only layers, compress base + YaRN otherwise."""

    def __init__(self, rope_dim: int, base: float, yarn: bool, args: ModelArgs,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.rope_dim = rope_dim
        self.key = (rope_dim, base, yarn)  # layers with equal keys rotate identically
        freqs = rope_frequencies(rope_dim, base, args.original_seq_len if yarn else 0, args.rope_factor,
                                 args.beta_fast, args.beta_slow)
        self.register_buffer("freqs", freqs.to(device), persistent=False)

    def cis(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [...] int64 → e^{i·pos·θ} [..., rope_dim/2] complex64, angle = pos·θ in fp32 as the reference."""
        ang = positions.to(self.freqs.device, torch.float32).unsqueeze(-1) * self.freqs
        return torch.polar(torch.ones_like(ang), ang)


def apply_rope(x: torch.Tensor, cis: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2·cis.size(-1) channels of x as complex pairs (x[2i], x[2i+1]) by cis.

    x [B, S, D] with cis [B, S, R/2], or x [B, S, H, D] (cis broadcast over heads). Returns a new tensor.
    inverse=True multiplies by the conjugate (strips a rotation again).
    """
    rd = 2 * cis.size(-1)
    if x.dim() == cis.dim() + 1:
        cis = cis.unsqueeze(-2)
    pairs = upcast(x[..., -rd:]).unflatten(-1, (-1, 2)).contiguous()      # [..., R/2, 2]
    z = torch.view_as_complex(pairs)
    rot = cis.to(z.dtype)
    out = torch.view_as_real(z * (rot.conj() if inverse else rot)).flatten(-2)
    return torch.cat([x[..., :-rd], out.to(x.dtype)], dim=-1)
