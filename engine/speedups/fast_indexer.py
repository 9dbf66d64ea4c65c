"""FastIndexer: the lightning indexer with fewer ops, and no scoring at all when every visible row fits the top-k."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.context import ForwardContext
from ..model.indexer import Indexer
from ..model.norm import upcast
from ..model.rope import apply_rope
from .call_values import call_rows, call_visible, call_width, every_visible_row
from .fast_quant import fp4_qdq, v4_index_qdq
from .fast_rope import MAX_ROTATED_POSITIONS, rotate, rotation_of
from .fast_topk import ascending_topk, candidate_blocks
from .sync_free import sync_free_active


class FastIndexer(Indexer):
    """Indexer.forward with four changes, none of which changes a result beyond float rounding:

    * when the call's widest row sees at most index_topk compressed rows, the top-k takes them all whatever
      their scores (−inf ones included), so the list is every visible row in order, returned without projecting
      queries or scoring keys. A candidate source then publishes no candidate mask; its readers share its index
      keys, hence its width, and take this shortcut too;
    * otherwise RoPE as one matmul (engine.speedups.fast_rope, up to MAX_ROTATED_POSITIONS) and the reference's
      query-block loop (scores_in_place: Indexer._scores's values);
    * FP4 rounding of queries and keys in half the ops (engine.speedups.fast_quant), bit for bit;
    * a long call (a prefill) scores each block of queries against the rows its last query can see, not the
      call's whole width (causal: the rest would be −inf, so the picks are the same; half the S·S/ratio scores),
      and picks the top-k by threshold (engine.speedups.fast_topk), not by a stable sort; its scores' elementwise
      steps run in place (scores_in_place), the candidate mask is written block by block, and at long
      widths the query blocks shrink so that a block's scores stay under SCORE_BLOCK_BYTES (block_rows): a long
      prefill holds the chunk's bool candidate mask and one block's scores, under engine.plan's "index scores"
      term (a chunk's fp32 scores).
    Autograd runs the reference code; sync_free() (the static shapes of CUDA graphs and torch.compile) the
    reference forward, over the fast inputs."""

    def _reference_needed(self, ctx: ForwardContext) -> bool:
        return sync_free_active() or (torch.is_grad_enabled() and self.wq_b.weight.requires_grad)

    def forward(self, x: torch.Tensor, qr: torch.Tensor, cis: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        role = self.role
        if self._reference_needed(ctx):
            return super().forward(x, qr, cis, ctx)
        ratio = ctx.cache.ratio[role.index_key_source]
        width = call_width(ctx, ratio)
        if width <= self.topk:
            return every_visible_row(ctx, ratio, width)   # width 0 too: an empty list
        q, w, keys, visible = self._inputs(x, qr, cis, ctx, width)
        S, k = x.size(1), self.topk
        step = block_rows(ctx.options.attn_query_block, x.size(0) * self.n_heads * width)
        starts = ctx.cached("starts", ctx.start.tolist)
        # reused by every block of this call; sized for its largest block (a decode step's is one row, not `step`)
        scratch = ScoreScratch(x.size(0) * min(step, S) * width, self.n_heads, keys)
        picks = []
        if role.candidate_source:   # filled block by block: no list of block masks to concatenate
            candidates = torch.zeros(x.size(0), S, width, dtype=torch.bool, device=x.device)   # [B, S, W]
        for s0 in range(0, S, step):      # query blocks bound the [B, block, h, W] scores, as in the reference
            sl = slice(s0, s0 + step)
            # causal: no query of this block sees a row past its last query's; those columns would be −inf
            seen = max((start + min(S, s0 + step)) // ratio for start in starts)
            vis = visible[:, sl]
            scores = scores_in_place(q[:, sl], w[:, sl], keys[:, :seen], vis, scratch)      # [B, s, seen]
            if role.candidate_source:
                candidates[:, sl, :seen] = candidate_blocks(scores, vis, self.top_blocks, self.block)
            elif role.uses_candidates:
                scores = self.filter_candidates(scores, ctx, sl)
            idx = ascending_topk(scores, min(k, seen))
            # the reference keeps any pick inside the visible range (even a −inf one), drops the rest
            idx = torch.where(idx < vis.unsqueeze(-1), idx, -1)
            picks.append(F.pad(idx, (0, k - idx.size(-1)), value=-1))   # past `seen`: picks the reference drops
        if role.candidate_source:
            ctx.candidates = candidates
        return torch.cat(picks, 1)

    def keys(self, latent: torch.Tensor, cis: torch.Tensor, quant: bool) -> torch.Tensor:
        if torch.is_grad_enabled() and self.wq_b.weight.requires_grad:
            return super().keys(latent, cis, quant)
        if hasattr(self, "compressor"):
            k = apply_rope(latent, cis)
            return v4_index_qdq(k) if quant else k
        k = apply_rope(self.k_norm(self.wk(latent)), cis)
        return fp4_qdq(k, 32, "ue8m0") if quant else k

    def rotated_keys(self, latent: torch.Tensor, rot: torch.Tensor, quant: bool) -> torch.Tensor:
        """keys() for latents at the call's own positions, rotated by the call's matrices rot [B, S, D', D']."""
        if hasattr(self, "compressor"):
            k = rotate(latent, rot)
            return v4_index_qdq(k) if quant else k
        k = rotate(self.k_norm(self.wk(latent)), rot)
        return fp4_qdq(k, 32, "ue8m0") if quant else k

    def _inputs(self, x, qr, cis, ctx: ForwardContext, width: int):
        B, S = x.shape[:2]
        if (torch.is_grad_enabled() and self.wq_b.weight.requires_grad) or B * S > MAX_ROTATED_POSITIONS:
            return super()._inputs(x, qr, cis, ctx, width)
        src = self.role.index_key_source
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))       # [B, S, h, d]
        q = rotate(q, rotation_of(ctx, cis, self.head_dim))
        if ctx.options.quant_sim:
            q = v4_index_qdq(q) if self.rotated else fp4_qdq(q, 32, "ue8m0")
        w = self.weights_proj(x) * (self.head_dim ** -0.5 * self.n_heads ** -0.5)   # [B, S, h]
        keys = upcast(call_rows(ctx, ctx.cache.index_k[src])[:, :width])             # [B, W, d]
        return q, w, keys, call_visible(ctx, ctx.cache.ratio[src])


SCORE_BLOCK_BYTES = 16 << 20   # fp32 [B, block, h, W] scores of one query block at most (at least MIN_BLOCK_ROWS rows)
MIN_BLOCK_ROWS = 16


def block_rows(query_block: int, values_per_row: int) -> int:
    """Query rows per scoring block: the options' attn_query_block, fewer where a row's B·h·W fp32 scores would put a
    block over SCORE_BLOCK_BYTES (a 32k-token prefill's 256-row block held 64 MB of scores and as much again in
    its temporaries), never under MIN_BLOCK_ROWS. The picks do not depend on it: each query is scored alone."""
    fitting = SCORE_BLOCK_BYTES // max(4 * values_per_row, 1)
    return max(min(query_block, fitting), min(query_block, MIN_BLOCK_ROWS))


class ScoreScratch:
    """The buffers of one indexer call's query blocks: their products [B·s·h·W] and scores [B·s·W] values at
    most. Each block's scores are written into the same memory, so a long prefill's blocks (their widths differ,
    `seen` grows block by block) leave no freed blocks of odd sizes behind for the heap to keep resident."""

    def __init__(self, scores_per_block: int, heads: int, like: torch.Tensor) -> None:
        """Buffers of `like`'s dtype (the keys': fp32, or float64 in a float64 model) and device."""
        self.products = like.new_empty(scores_per_block * heads)
        self.scores = like.new_empty(scores_per_block)

    def views(self, batch: int, rows: int, heads: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, s·h, W] products and [B, s, W] scores over the buffers' first values."""
        return (self.products[: batch * rows * heads * width].view(batch, rows * heads, width),
                self.scores[: batch * rows * width].view(batch, rows, width))


def scores_in_place(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor,
                    scratch: ScoreScratch | None = None) -> torch.Tensor:
    """Indexer._scores with its elementwise steps in place: the same values, one [B, s, h, W] buffer instead of
    three alive at once (a 256-row block's is 64 MB at 32k tokens and two index heads). With `scratch` the products
    and the scores are written into its buffers (the result is a view of them, valid until the next block's)."""
    B, s, h, d = q.shape
    W = keys.size(1)
    if scratch is None:
        scratch = ScoreScratch(B * s * W, h, keys)
    products, scores = scratch.views(B, s, h, W)
    torch.bmm(upcast(q).reshape(B, s * h, d), keys.transpose(1, 2), out=products)   # [B, s·h, W]
    products = products.view(B, s, h, W).relu_().mul_(upcast(w).unsqueeze(-1))     # [B, s, h, W]
    torch.sum(products, 2, out=scores)                                               # [B, s, W]
    invisible = torch.arange(W, device=keys.device) >= visible.unsqueeze(-1)
    return scores.masked_fill_(invisible, float("-inf"))
