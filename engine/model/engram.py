"""Engram (spec §4.4): n-gram hash rows gathered from a table, projected by wkv, gated per stream, added."""
from __future__ import annotations

import torch
from torch import nn

from ..spec.config import ModelArgs
from ..text.engram_hash import DEAD, NgramHash
from .linear import Linear
from .norm import upcast

__all__ = ["DEAD", "Engram", "NgramRows"]


class NgramRows:
    """Hash of §4.4.3 for all Engram layers over the cache's per-row history of compressed ids: the torch
    face of engine.text.engram_hash.NgramHash. Runs on the CPU in int64 (the history lives there)."""

    def __init__(self, args: ModelArgs) -> None:
        self.hash = NgramHash(args)

    def __call__(self, history: torch.Tensor, positions: torch.Tensor, pad: int) -> torch.Tensor:
        """history [B, T] (already holding this call's ids), positions [B, S] → row ids [B, S, L, cols]."""
        return torch.from_numpy(self.hash(history.numpy(), positions.numpy(), pad))


class Engram(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, n_rows: int, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.layer, self.hc, self.dim, self.eps = layer, args.hc_mult, args.dim, args.norm_eps
        self.slot = args.engram_layer_ids.index(layer)                        # which hash layer
        self.embed = nn.Embedding(n_rows, args.engram_head_dim, dtype=dtype, device=device)
        self.wkv = Linear(args.engram_n_columns * args.engram_head_dim, args.dim * (args.hc_mult + 1),
                          quantized=True, dtype=dtype, device=device)
        # stored bf16 in the checkpoint, used in fp32
        self.q_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim, dtype=dtype, device=device))
        self.k_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim, dtype=dtype, device=device))

    def forward(self, h: torch.Tensor, row_ids: torch.Tensor,
                live: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, S, hc, dim], row_ids [B, S, cols], live [B, S] (False = DEAD) → (h', gates [B, S, hc])."""
        rows = self.embed(row_ids.to(self.embed.weight.device))               # [B, S, cols, head_dim]
        kv = self.wkv(rows.flatten(-2).to(h.dtype))                           # [B, S, (hc+1)·dim]
        key = upcast(kv[..., : self.hc * self.dim]).unflatten(-1, (self.hc, self.dim))   # [B, S, hc, dim]
        value = upcast(kv[..., self.hc * self.dim:])                          # [B, S, dim]
        w = upcast(self.q_weight) * upcast(self.k_weight)                     # only the product matters
        hf = upcast(h)
        # per (token, stream) normalisation over dim, not jointly across the streams
        rstd = torch.rsqrt(hf.square().mean(-1) + self.eps) * torch.rsqrt(key.square().mean(-1) + self.eps)
        dot = (hf * w * key).sum(-1) * rstd * self.dim ** -0.5
        gate = self.gate_of(dot)
        if live is not None:
            gate = gate.masked_fill(~live.unsqueeze(-1), 0)
        return (hf + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(h.dtype), gate

    @staticmethod
    def gate_of(dot: torch.Tensor) -> torch.Tensor:
        """The gate of a scaled dot product: sigmoid of its signed square root."""
        return torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
