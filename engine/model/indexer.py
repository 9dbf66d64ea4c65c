"""Lightning indexer (spec §4.3.2; V4 §11): Own / Reindex query heads over index keys, candidate filter, top-k."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec.config import ModelArgs
from ..spec.roles import LayerRole, family_roles
from .compressor import Compressor
from .context import ForwardContext
from .linear import Linear
from .norm import RMSNorm, upcast
from .quant import fp4_qdq, v4_index_qdq
from .rope import apply_rope


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries along the last dim; ties (−inf included) go to the lower index,
    so the choice is deterministic and does not depend on how wide the row is padded."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def candidate_block_scores(scores: torch.Tensor, visible: torch.Tensor, block: int) -> torch.Tensor:
    """Each block of `block` positions scored by its best position: [B, S, W] scores, visible [B, S] →
    [B, S, ceil(W / block)], the newest visible block (only partly filled) pinned to +inf so that older full blocks
    cannot outscore it."""
    width = scores.size(-1)
    padded = F.pad(scores, (0, -width % block), value=float("-inf"))
    block_scores = padded.unflatten(-1, (-1, block)).amax(-1)            # [B, S, n_blocks]
    newest = ((visible - 1).div(block, rounding_mode="floor")).unsqueeze(-1)
    blocks = torch.arange(block_scores.size(-1), device=scores.device)
    return block_scores.masked_fill(blocks == newest, float("inf"))


def select_candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, top_blocks: int, block: int) -> torch.Tensor:
    """Level one of the hierarchical top-k: [B, S, W] scores (unreachable = −inf), visible [B, S] →
    bool mask [B, S, W] of the positions inside each query's `top_blocks` best blocks of `block` positions."""
    width = scores.size(-1)
    block_scores = candidate_block_scores(scores, visible, block)        # [B, S, n_blocks]
    n_blocks = block_scores.size(-1)
    top = stable_topk(block_scores, min(top_blocks, n_blocks))
    reachable = block_scores.gather(-1, top) > float("-inf")              # fewer reachable blocks: drop the rest
    keep = torch.zeros_like(block_scores, dtype=torch.bool).scatter_(-1, top, reachable)
    return keep.repeat_interleave(block, dim=-1)[..., :width]


class Indexer(nn.Module):
    """Index source of one layer. Key owners also make the index keys: a V4.1 KV source from each compressed KV
    latent (wk, k_norm); a V4 CSA layer with a compressor of its own over the layer input (spec §11)."""

    def __init__(self, args: ModelArgs, role: LayerRole, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.role = role
        self.owns_keys = role.indexer == "own"
        family = family_roles(args)
        self.rotated = family.v4_quant_sim   # V4: Hadamard-rotated FP4 queries and keys in quant simulation
        self.n_heads, self.head_dim = args.index_n_heads, args.index_head_dim
        self.topk = args.index_topk
        self.top_blocks, self.block = args.candidate_topk_blocks, args.candidate_block_size
        self.wq_b = Linear(args.q_lora_rank, self.n_heads * self.head_dim, quantized=True, dtype=dtype, device=device)
        self.weights_proj = Linear(args.dim, self.n_heads, dtype=dtype, device=device)
        if self.owns_keys and family.key_compressor:
            self.compressor = Compressor(args, role.ratio, role.layer, head_dim=self.head_dim,
                                         pending=f"{role.layer}.indexer", dtype=dtype, device=device)
        elif self.owns_keys:
            self.wk = Linear(args.head_dim, self.head_dim, dtype=dtype, device=device)
            self.k_norm = RMSNorm(self.head_dim, args.norm_eps, dtype=dtype, device=device)

    def keys(self, latent: torch.Tensor, cis: torch.Tensor, quant: bool) -> torch.Tensor:
        """Pre-RoPE latents [B, G, ·] → index keys [B, G, index_head_dim] (rope at the group position). V4.1: the
        compressed KV latents, projected; V4: the latents of the indexer's own compressor, already keys."""
        if hasattr(self, "compressor"):
            k = apply_rope(latent, cis)
            return v4_index_qdq(k) if quant else k
        k = apply_rope(self.k_norm(self.wk(latent)), cis)
        return fp4_qdq(k, 32, "ue8m0") if quant else k

    def forward(self, x: torch.Tensor, qr: torch.Tensor, cis: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """→ index list [B, S, k] of compressed rows (ascending; −1 = empty) for this call's queries."""
        role, B, S = self.role, x.size(0), x.size(1)
        width = ctx.width(ctx.cache.ratio[role.index_key_source])
        if width == 0:
            return torch.empty(B, S, 0, dtype=torch.long, device=x.device)
        q, w, keys, visible = self._inputs(x, qr, cis, ctx, width)
        k = min(self.topk, width)
        masks, picks = [], []
        step = ctx.options.attn_query_block   # bounds the [B, block, h, W] score tensor in long prefills
        for s0 in range(0, S, step):
            sl = slice(s0, s0 + step)
            vis = visible[:, sl]
            scores = self._scores(q[:, sl], w[:, sl], keys, vis)                         # [B, s, W]
            if role.candidate_source:
                masks.append(select_candidate_blocks(scores, vis, self.top_blocks, self.block))
            elif role.uses_candidates:
                scores = self.filter_candidates(scores, ctx, sl)
            idx = stable_topk(scores, k).sort(-1).values
            # the reference keeps any pick inside the visible range (even a −inf one), drops the rest
            picks.append(torch.where(idx < vis.unsqueeze(-1), idx, -1))
        if role.candidate_source:
            ctx.candidates = torch.cat(masks, 1)
        return torch.cat(picks, 1)

    def filter_candidates(self, scores: torch.Tensor, ctx: ForwardContext, sl: slice = slice(None)) -> torch.Tensor:
        """Level two of the hierarchical top-k: scores [B, s, W] of the queries ctx.positions[:, sl], −inf outside
        the candidate blocks the candidate source published for them (scores may cover only the first W rows)."""
        if ctx.candidates is None:
            raise RuntimeError(f"{self.role.path}: candidate mask missing; its candidate source did not run")
        keep = ctx.candidates[:, sl, :scores.size(-1)]                              # [B, s, W]
        skipped = ctx.interventions.candidate_filter_off(ctx.positions[:, sl])      # [B, s] or None
        if skipped is not None:  # intervention: no candidate filter there, every visible row is scored
            keep = keep | skipped.unsqueeze(-1)
        return scores.masked_fill(~keep, float("-inf"))

    def dense_scores(self, x: torch.Tensor, qr: torch.Tensor, cis: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """All index scores [B, S, W] (invisible rows −inf, no candidate filter), differentiable in the
        indexer's own weights only: the inputs are detached (training's IndexerLoss)."""
        width = ctx.width(ctx.cache.ratio[self.role.index_key_source])
        q, w, keys, visible = self._inputs(x.detach(), qr.detach(), cis, ctx, width)
        return self._scores(q, w, keys, visible)

    def _inputs(self, x, qr, cis, ctx: ForwardContext, width: int):
        """(q [B, S, h, d], head weights [B, S, h], keys [B, W, d], visible [B, S])."""
        src = self.role.index_key_source
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))       # [B, S, h, d]
        q = apply_rope(q, cis)
        if ctx.options.quant_sim:
            q = v4_index_qdq(q) if self.rotated else fp4_qdq(q, 32, "ue8m0")
        w = self.weights_proj(x) * (self.head_dim ** -0.5 * self.n_heads ** -0.5)   # [B, S, h]
        keys = upcast(ctx.cache.index_k[src][ctx.rows_dev, :width])                  # [B, W, d]
        return q, w, keys, ctx.visible(ctx.cache.ratio[src])

    @staticmethod
    def _scores(q, w, keys, visible) -> torch.Tensor:
        """Σ_h w_h · relu(q_h · k) per (query, row) → [B, s, W]; rows beyond `visible` are −inf."""
        scores = torch.einsum("bshd,btd->bsht", upcast(q), keys).relu()
        scores = (scores * upcast(w).unsqueeze(-1)).sum(2)                           # [B, s, W]
        width = keys.size(1)
        return scores.masked_fill(torch.arange(width, device=keys.device) >= visible.unsqueeze(-1), float("-inf"))
