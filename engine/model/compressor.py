"""Compressor (spec §4.3.1; V4 §11): gated softmax pooling of `ratio` tokens into one latent, with pending state."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec.config import ModelArgs
from ..spec.roles import family_roles
from .context import ForwardContext
from .linear import Linear
from .norm import RMSNorm, upcast


class Compressor(nn.Module):
    """One latent per `ratio` tokens. V4.1: ratio 1 is a plain projection, ratio 2 gated pairs. V4 adds a learned
    gate bias per window slot (`ape`), and at its overlap ratio (4, CSA) each latent pools 2·ratio tokens: the first
    half of the channels (Ca) of the previous window's tokens with the second half (Cb) of this window's, so wkv and
    wgate are twice `head_dim` wide. The index keys of a V4 CSA layer have a compressor of their own (index_head_dim).
    `pending` names this compressor's ring of recent inputs in ModelCache.pending."""

    def __init__(self, args: ModelArgs, ratio: int, layer: int, head_dim: int | None = None,
                 pending: int | str | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        family = family_roles(args)
        self.ratio, self.layer = ratio, layer
        self.head_dim = head_dim or args.head_dim
        self.overlap = ratio == family.overlap_ratio
        self.pending = layer if pending is None else pending
        self.gated = ratio > 1 or family.ape
        width = (2 if self.overlap else 1) * self.head_dim
        if family.ape:  # fp32 in the checkpoint, like the other gate biases
            fp32 = torch.float64 if dtype == torch.float64 else torch.float32
            self.ape = nn.Parameter(torch.zeros(ratio, width, dtype=fp32, device=device))
        self.wkv = Linear(args.dim, width, dtype=dtype, device=device)
        if self.gated:
            self.wgate = Linear(args.dim, width, dtype=dtype, device=device)
        self.norm = RMSNorm(self.head_dim, args.norm_eps, dtype=dtype, device=device)

    @property
    def ring_tokens(self) -> int:
        """Tokens before a call's first one that a group completed in it can need: one window, two with overlap."""
        return (2 if self.overlap else 1) * self.ratio

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, dim] → (latents [B, G, head_dim] pre-RoPE, group ids [B, G], valid [B, G]).

        Row b completes groups start_b//r .. (start_b + S)//r − 1; G is the most any row completes.
        """
        r, S = self.ratio, ctx.n_tokens
        first = ctx.start // r                               # [B] CPU (a CUDA-graph body's: on the device)
        n_done = (ctx.start + S) // r - first                # [B] groups each row completes now
        G = ctx.groups_out(n_done, r)                        # rows completing fewer mark the rest invalid
        dev = x.device
        span = torch.arange(G, device=first.device)
        group = (first.unsqueeze(1) + span).to(dev)                        # [B, G]
        valid = (span.unsqueeze(0) < n_done.unsqueeze(1)).to(dev)
        if not self.gated:  # V4.1 ratio 1: one token per group, a plain projection in the activation dtype
            return self.norm(self.wkv(x)), group, valid
        # gate-weighted softmax pooling in fp32 over the tokens of each group
        kv, gate = self.project(upcast(x))                   # [B, S, W] each
        ring_kv, ring_gate = ctx.cache.pending[self.pending]
        rows = ctx.rows_dev
        P = ring_kv.size(1)
        start = ctx.start.to(dev).view(-1, 1, 1)
        pool_kv = torch.cat([ring_kv[rows], kv], 1)          # [B, P + S, W]
        pool_gate = torch.cat([ring_gate[rows], gate], 1)

        def gather(tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Token positions [B, G, n] → their (kv, gate) [B, G, n, W]: a token of this call sits at
            P + (t − start) in [ring ; chunk], an earlier one in its ring slot."""
            src = torch.where(tok >= start, P + tok - start, tok % P).clamp(0, P + S - 1)
            flat = src.flatten(1).unsqueeze(-1).expand(-1, -1, kv.size(-1))
            shape = (G, tok.size(-1))
            return pool_kv.gather(1, flat).unflatten(1, shape), pool_gate.gather(1, flat).unflatten(1, shape)

        tok = group.unsqueeze(-1) * r + torch.arange(r, device=dev)        # [B, G, r] token positions
        g_kv, g_gate = gather(tok)
        if hasattr(self, "ape"):
            g_gate = g_gate + upcast(self.ape)                # slot j of every window gets ape[j]
        if self.overlap:
            d = self.head_dim
            p_kv, p_gate = gather(tok - r)                    # the previous window's tokens
            p_gate = (p_gate + upcast(self.ape)).masked_fill((tok < r).unsqueeze(-1), float("-inf"))  # window 0: none
            g_kv = torch.cat([p_kv[..., :d], g_kv[..., d:]], 2)                 # [B, G, 2r, d]: Ca then Cb
            g_gate = torch.cat([p_gate[..., :d], g_gate[..., d:]], 2)
        latent = (g_kv * g_gate.softmax(dim=2)).sum(2)        # softmax over the pooled tokens, per channel
        # remember the newest tokens' inputs so a group left open here can be finished later
        keep = min(S, P)
        slots = (ctx.positions[:, S - keep:] % P)             # [B, keep]
        ring_kv[rows.unsqueeze(1), slots] = kv[:, S - keep:].to(ring_kv.dtype)
        ring_gate[rows.unsqueeze(1), slots] = gate[:, S - keep:].to(ring_gate.dtype)
        return self.norm(latent.to(x.dtype)), group, valid

    def project(self, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 input [B, S, dim] → its (kv, gate) [B, S, W], in fp32."""
        return F.linear(xf, upcast(self.wkv.weight)), F.linear(xf, upcast(self.wgate.weight))
