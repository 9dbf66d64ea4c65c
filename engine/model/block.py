"""Block (spec §4.2): attention and MoE between collapse/expand of the hc streams (V4.1 single-pass, V4 per-site)."""
from __future__ import annotations

import torch
from torch import nn

from ..spec.config import ModelArgs
from ..spec.roles import LayerRole, family_roles
from .attention import Attention
from .context import ForwardContext
from .engram import Engram
from .mhc import collapse, expand, hc_mixes, sinkhorn
from .moe import MoE
from .norm import RMSNorm


class Block(nn.Module):
    def __init__(self, args: ModelArgs, role: LayerRole, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.role, self.path = role, role.path
        self.hc, self.iters, self.hc_eps, self.norm_eps = (args.hc_mult, args.hc_sinkhorn_iters,
                                                           args.hc_eps, args.norm_eps)
        self.single_pass = family_roles(args).single_pass_mhc
        self.sinkhorn = sinkhorn  # the op, swappable for an equivalent one (engine.speedups)
        kw = dict(dtype=dtype, device=device)
        self.attn_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.attn = Attention(args, role, **kw)
        n_exp = args.draft_n_routed_experts if role.draft else args.n_routed_experts
        k = args.draft_n_activated_experts if role.draft else args.n_activated_experts
        self.ffn = MoE(args, n_exp, k, hash_routed=role.hash_routed, **kw)
        fp32 = torch.float64 if dtype == torch.float64 else torch.float32
        mix, width = args.hc_mix_dim, args.hc_dim
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}_fn", nn.Parameter(torch.zeros(mix, width, dtype=fp32, device=device)))
            setattr(self, f"hc_{site}_base", nn.Parameter(torch.zeros(mix, dtype=fp32, device=device)))
            setattr(self, f"hc_{site}_scale", nn.Parameter(torch.ones(3, dtype=fp32, device=device)))
        if role.engram:
            n_rows = args.engram_num_embeddings[args.engram_layer_ids.index(role.layer)]
            self.engram = Engram(args, role.layer, n_rows, **kw)

    def mixes(self, x: torch.Tensor, site: str, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pre, post, comb = hc_mixes(x, getattr(self, f"hc_{site}_fn"), getattr(self, f"hc_{site}_scale"),
                                   getattr(self, f"hc_{site}_base"), self.iters, self.hc_eps, self.norm_eps,
                                   self.sinkhorn)
        pinned = ctx.interventions.mhc_identity(self.role.layer, ctx.positions)      # [B, S] or None
        if pinned is not None:  # intervention: the residual mixing matrix is the identity there (pre, post kept)
            comb = torch.where(pinned[..., None, None], torch.eye(self.hc, dtype=comb.dtype, device=comb.device), comb)
        if ctx.trace is not None:
            rows, pos = ctx.trace_rows()
            ctx.trace.record_mhc(self.path, site, rows, pos, pre, post, comb)   # the trace derives the residuals
        return pre, post, comb

    def forward(self, x: torch.Tensor, pre_in: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, hc, dim], pre_in [B, S, hc] (the previous site's pre) → (x', this block's ffn pre).

        Each site computes (pre, post, comb) from its own input. V4.1 (single pass) hands `pre` on to the next
        site and collapses with the one it was handed; V4 collapses each site with its own pre (pre_in unused)."""
        a_pre, a_post, a_comb = self.mixes(x, "attn", ctx)
        f = self.attn(self.attn_norm(collapse(x, pre_in if self.single_pass else a_pre)), ctx)
        x = expand(f, x, a_post, a_comb)
        f_pre, f_post, f_comb = self.mixes(x, "ffn", ctx)
        f = self.moe(self.ffn_norm(collapse(x, a_pre if self.single_pass else f_pre)), ctx)
        return expand(f, x, f_post, f_comb), f_pre

    def moe(self, xn: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The MoE on the normed collapse xn [B, S, dim] → [B, S, dim], its routing recorded in the trace."""
        if self.ffn.hash_routed:  # V4: the token ids pick the experts
            f, (weights, ids, scores) = self.ffn(xn, ctx.image_mask, ctx.tokens)
        else:  # steer: the banned and forced experts of interventions at this layer (None: none)
            steer = ctx.interventions.expert_steer(self.role.layer, ctx.positions, self.ffn.n_experts)
            f, (weights, ids, scores) = self.ffn(xn, ctx.image_mask, steer=steer)
        if ctx.trace is not None:
            rows, pos = ctx.trace_rows()
            ctx.trace.record_moe(f"{self.path}.ffn", rows, pos, ids, weights, scores, ctx.image_mask)
        return f
