"""The drafter's speed paths: its attention over ring and block as FastAttention computes a verify block, and its
Markov head's bias from a transposed copy."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.draft import DraftAttention, DraftContext, MarkovHead
from ..model.norm import upcast
from .casts import cast
from .derived import derived
from .fast_attention import FastAttention
from .fast_head import FEW_ROWS
from .fast_quant import fp8_qdq, v4_kv_qdq
from .fast_rope import MAX_ROTATED_POSITIONS, inverse_rotation, rotate, rotation, rotation_for, scaled_rotation
from .window_attention import window_attention


def draft_hidden_keys(ctx: DraftContext, slots: int, block: int) -> torch.Tensor:
    """[B, 1, 1, slots + block] True where a key is not read: ring slots outside ctx.ring_index (the window's
    valid slots); the block's own rows are read by every query. Once per draft call (every stage's ring has
    the same slots), from device tensors only (a graphed draft reads no value back)."""
    def make() -> torch.Tensor:
        index = ctx.ring_index                                               # [B, K], −1 = empty
        read = torch.zeros(index.size(0), slots + 1, dtype=torch.bool, device=index.device)
        read.scatter_(1, torch.where(index >= 0, index, slots), True)        # empty entries mark the spare column
        read = torch.cat([read[:, :slots], read.new_ones(index.size(0), block)], 1)
        return ~read.view(index.size(0), 1, 1, -1)
    return ctx.cached(("draft_hidden_keys", slots, block), make)


class FastDraftAttention(DraftAttention, FastAttention):
    """DraftAttention.forward with FastAttention's ops: RoPE (and the softmax scale) as one matmul per tensor, the
    FP8 KV rounding of engine.speedups.fast_quant, attention as one masked matmul over [ring ; block] (keys the
    query may not read hidden; engine.speedups.window_attention) instead of gathering each query's rows, the
    grouped output projection as one batched matmul over the groups; a step's taps enter the rings with the same
    RoPE and rounding (ring_kv). Keys are summed in ring order, so only rounding differs; static shapes (a graphed
    draft) take the same path, which reads no value back. With autograd on (training the drafter), the reference
    code runs."""

    def ring_kv(self, main_x: torch.Tensor, positions: torch.Tensor, quant: bool) -> torch.Tensor:
        """DraftAttention.ring_kv (a step's taps into the rings) with the one-matmul RoPE and the fast FP8 rounding,
        for a few positions (a prefill's many take the reference code)."""
        if (torch.is_grad_enabled() and self.wkv.weight.requires_grad) or positions.numel() > MAX_ROTATED_POSITIONS:
            return super().ring_kv(main_x, positions, quant)
        kv = rotate(self.kv_norm(self.wkv(main_x)), rotation_for(self.rotary, positions, self.head_dim))
        if quant:
            kv = v4_kv_qdq(kv, self.rope_dim) if self.v4_quant else fp8_qdq(kv)
        return kv                                                            # [B, S, head_dim]

    def forward(self, x: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.wkv.weight.requires_grad):
            return DraftAttention.forward(self, x, ctx)
        S = x.size(1)
        q_low, kv = self._input_projections(x)                                # [B, γ, q_rank], [B, γ, D]
        q = self.wq_b(self.q_norm(q_low)).unflatten(-1, (self.n_heads, self.head_dim))   # [B, γ, H, D]
        if self.q_head_norm:
            q = F.rms_norm(q, (self.head_dim,), None, self.norm_eps)
        math_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        q = rotate(q, scaled_rotation(ctx, self.rotary, self.head_dim, self.scale, math_dtype))   # q·scale, rotated
        kv = rotate(self.kv_norm(kv), rotation(ctx, self.rotary, self.head_dim))   # [B, γ, D]
        if ctx.quant_sim:
            kv = v4_kv_qdq(kv, self.rope_dim) if self.v4_quant else fp8_qdq(kv)
        ring = ctx.rings[self.layer]                                         # [B, slots, D]
        keys = torch.cat([ring, cast(kv, ring.dtype)], 1)                    # [B, slots + γ, D]
        o = window_attention(q, keys, draft_hidden_keys(ctx, ring.size(1), S), self.attn_sink)   # [B, γ, H, D]
        o = rotate(o, inverse_rotation(ctx, self.rotary, self.head_dim))     # strip the query rotation V carries
        return self.grouped_output(o)


class FastMarkovHead(MarkovHead):
    """MarkovHead.forward with the bias W2·e of a few rows on the CPU read from a transposed fp32 copy of W2 [r, V]
    (a draft step asks for one row per request and draft: the [V, r] product of one row takes MKL's slow path, as
    the vocabulary head's does; engine.speedups.fast_head). Same values up to float rounding; with autograd on
    (training the drafter), the reference code runs."""

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w2 = self.w2.weight
        if (torch.is_grad_enabled() and w2.requires_grad) or prev.numel() > FEW_ROWS or w2.device.type != "cpu":
            return super().forward(prev)
        e = self.w1(prev)                                                    # [..., r]
        w2_t = derived(self).get("w2_t", (w2,), lambda: upcast(w2).t().contiguous())   # [r, V]
        return e, (cast(e, w2_t.dtype).reshape(-1, e.size(-1)) @ w2_t).view(*e.shape[:-1], -1)
