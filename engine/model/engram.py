"""Engram (spec §4.4): n-gram hash rows gathered from a table, projected by wkv, gated per stream, added."""
from __future__ import annotations

import torch
from torch import nn

from ..spec import engram_layout
from .linear import Linear
from .norm import upcast

DEAD = -1


class NgramRows:
    """Hash of §4.4.3 for all Engram layers over the cache's per-row history of compressed ids. Runs on
    the CPU in int64 (the history lives there); equals engine.text.engram_hash.NgramHasher (tested)."""

    def __init__(self, args):
        self.max_n = args.engram_max_ngram_size
        self.n_heads = args.engram_n_heads
        # [L, max_n] multipliers, [L, cols] primes and offsets; column order: n-gram size major, head minor
        self.mult = torch.tensor(engram_layout.multipliers(args), dtype=torch.long)
        self.primes = torch.tensor(engram_layout.table_sizes(args), dtype=torch.long)
        self.offsets = torch.tensor(engram_layout.offsets(args), dtype=torch.long)

    def __call__(self, history: torch.Tensor, positions: torch.Tensor, pad: int) -> torch.Tensor:
        """history [B, T] (already holding this call's ids), positions [B, S] → row ids [B, S, L, cols]."""
        blocked = torch.zeros(positions.shape, dtype=torch.bool)
        mult = self.mult
        acc = None
        out = []
        for s in range(self.max_n):
            src_pos = positions - s
            src = history.gather(1, src_pos.clamp_min(0))
            blocked = blocked | (src_pos < 0) | (src == DEAD)               # once blocked, longer n-grams stay blocked
            tok = torch.where(blocked, pad, src)                             # [B, S]
            term = tok.unsqueeze(-1) * mult[:, s]                            # [B, S, L]; < 2^63 by construction
            acc = term if acc is None else acc ^ term
            if s >= 1:                                                       # an (s+1)-gram
                out.append(acc.unsqueeze(-1).expand(*acc.shape, self.n_heads))
        h = torch.cat(out, -1)                                               # [B, S, L, cols]
        return h % self.primes + self.offsets


class Engram(nn.Module):
    def __init__(self, args, layer: int, n_rows: int, dtype=None, device=None):
        super().__init__()
        self.layer, self.hc, self.dim, self.eps = layer, args.hc_mult, args.dim, args.norm_eps
        self.slot = args.engram_layer_ids.index(layer)                        # which hash layer
        self.embed = nn.Embedding(n_rows, args.engram_head_dim, dtype=dtype, device=device)
        self.wkv = Linear(args.engram_n_columns * args.engram_head_dim, args.dim * (args.hc_mult + 1),
                          quantized=True, dtype=dtype, device=device)
        # stored bf16 in the checkpoint, used in fp32
        self.q_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim, dtype=dtype, device=device))
        self.k_weight = nn.Parameter(torch.ones(args.hc_mult, args.dim, dtype=dtype, device=device))

    def forward(self, h: torch.Tensor, row_ids: torch.Tensor, live: torch.Tensor | None):
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
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))   # signed sqrt
        if live is not None:
            gate = gate.masked_fill(~live.unsqueeze(-1), 0)
        return (hf + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(h.dtype), gate
