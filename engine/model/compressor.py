"""Compressor of a KV-source layer (spec §4.3.1): ratio-2 gated pairs with pending state, or ratio 1."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .context import ForwardContext
from .linear import Linear
from .norm import RMSNorm, upcast


class Compressor(nn.Module):
    def __init__(self, args, ratio: int, layer: int, dtype=None, device=None):
        super().__init__()
        self.ratio, self.layer = ratio, layer
        self.wkv = Linear(args.dim, args.head_dim, dtype=dtype, device=device)
        if ratio > 1:
            self.wgate = Linear(args.dim, args.head_dim, dtype=dtype, device=device)
        self.norm = RMSNorm(args.head_dim, args.norm_eps, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, dim] → (latents [B, G, head_dim] pre-RoPE, group ids [B, G], valid [B, G]).

        Row b completes groups start_b//r .. (start_b + S)//r − 1; G is the most any row completes.
        """
        r, S = self.ratio, ctx.n_tokens
        first = ctx.start // r                               # [B] CPU (on the device with static shapes)
        n_done = (ctx.start + S) // r - first                # [B] groups each row completes now
        # static shapes: the most groups any row can complete in S tokens; rows completing fewer mark the
        # rest invalid (their writes go to the scratch row), so no value is read back to size G
        G = -(-S // r) if ctx.static else int(n_done.max())
        dev = x.device
        span = torch.arange(G, device=first.device)
        group = (first.unsqueeze(1) + span).to(dev)                        # [B, G]
        valid = (span.unsqueeze(0) < n_done.unsqueeze(1)).to(dev)
        if r == 1:  # one token per group: a plain projection, in the activation dtype
            return self.norm(self.wkv(x)), group, valid
        # ratio > 1: gate-weighted softmax pooling in fp32 over the tokens of each group
        xf = upcast(x)
        kv = F.linear(xf, upcast(self.wkv.weight))           # [B, S, D]
        gate = F.linear(xf, upcast(self.wgate.weight))
        ring_kv, ring_gate = ctx.cache.pending[self.layer]
        rows = ctx.rows_dev
        P = ring_kv.size(1)
        start = ctx.start.to(dev).view(-1, 1, 1)
        tok = group.unsqueeze(-1) * r + torch.arange(r, device=dev)        # [B, G, r] token positions
        # a token of this call sits at P + (t − start) in [ring ; chunk]; an earlier one in its ring slot
        src = torch.where(tok >= start, P + tok - start, tok % P).clamp(0, P + S - 1)
        pool_kv = torch.cat([ring_kv[rows], kv], 1)          # [B, P + S, D]
        pool_gate = torch.cat([ring_gate[rows], gate], 1)
        flat = src.flatten(1).unsqueeze(-1).expand(-1, -1, kv.size(-1))
        g_kv = pool_kv.gather(1, flat).unflatten(1, (G, r))  # [B, G, r, D]
        g_gate = pool_gate.gather(1, flat).unflatten(1, (G, r))
        latent = (g_kv * g_gate.softmax(dim=2)).sum(2)        # softmax over the r tokens, per channel
        # remember the newest tokens' inputs so a group left open here can be finished later
        keep = min(S, P)
        slots = (ctx.positions[:, S - keep:] % P)             # [B, keep]
        ring_kv[rows.unsqueeze(1), slots] = kv[:, S - keep:].to(ring_kv.dtype)
        ring_gate[rows.unsqueeze(1), slots] = gate[:, S - keep:].to(ring_gate.dtype)
        return self.norm(latent.to(x.dtype)), group, valid
