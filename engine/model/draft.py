"""DSpark drafter stages `mtp.{s}` (spec §7): ordinary blocks whose attention reads a ring of tapped target
features plus the whole draft block (non-causal inside it), and the last stage's Markov and confidence heads."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .block import Block
from .linear import Linear
from .mhc import collapse
from .norm import RMSNorm, upcast
from .quant import fp8_qdq
from .rope import apply_rope
from .sparse_attn import sparse_attn


class MarkovHead(nn.Module):
    def __init__(self, args, dtype=None, device=None):
        super().__init__()
        self.embed = nn.Embedding(args.vocab_size, args.dspark_markov_rank, dtype=dtype, device=device)   # W1
        self.head = Linear(args.dspark_markov_rank, args.vocab_size, dtype=dtype, device=device)          # W2 [V, r]

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev [B] token ids → (e [B, r] the W1 row, bias [B, V] fp32 added to the base logits)."""
        e = self.embed(prev)
        return e, F.linear(upcast(e), upcast(self.head.weight))


class ConfidenceHead(nn.Module):
    def __init__(self, args, dtype=None, device=None):
        super().__init__()
        self.proj = Linear(args.dim + args.dspark_markov_rank, 1, dtype=dtype, device=device)

    def forward(self, hidden: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """hidden [B, dim] (pre-norm collapse), e [B, r] → raw confidence logit z [B] (fp32, spec Eq. 7)."""
        x = torch.cat([upcast(hidden), upcast(e)], -1)                      # [B, dim + r]
        return F.linear(x, upcast(self.proj.weight)).squeeze(-1)


@dataclass
class DraftContext:
    """What one draft-block forward shares across the stages (the drafter's analogue of ForwardContext)."""
    rows: torch.Tensor              # [B] cache rows (CPU), for the trace
    positions: torch.Tensor         # [B, γ] absolute positions of the block (model device)
    rings: dict[int, torch.Tensor]  # layer id → [B, slots, head_dim] this batch's ring rows
    ring_index: torch.Tensor        # [B, K] ring slots each block query may read (−1 = empty)
    quant_sim: bool = True
    trace: object | None = None
    image_mask: torch.Tensor | None = None
    memo: dict = field(default_factory=dict)
    static: bool = False            # CUDA-graph draft body: static shapes, no host reads (engine.graphs)

    def cached(self, key, make):
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def trace_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, positions) as the Trace receives them; static: the device tensors as they are (the graph's
        trace buffers ignore them and the host supplies its own)."""
        if self.static:
            return self.rows, self.positions
        return self.rows, self.cached("positions_cpu", lambda: self.positions.cpu())


class DraftAttention(Attention):
    """The backbone's attention modules (same parameter names) with the drafter's key set: every block
    query reads every valid ring row and every row of the block."""

    def ring_kv(self, main_x: torch.Tensor, positions: torch.Tensor, quant: bool) -> torch.Tensor:
        """main_x [B, S, dim] at absolute positions [B, S] → ring rows [B, S, head_dim] (spec §7 prefill)."""
        kv = apply_rope(self.kv_norm(self.wkv(main_x)), self.rotary.cis(positions))
        return fp8_qdq(kv) if quant else kv

    def forward(self, x: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """x [B, γ, dim] (normed collapse of the block's streams) → [B, γ, dim]."""
        B, S, _ = x.shape
        cis = ctx.cached(("cis", self.rotary.key), lambda: self.rotary.cis(ctx.positions))  # [B, γ, rope/2]
        q = apply_rope(self.wq_b(self.q_norm(self.wq_a(x))).unflatten(-1, (self.n_heads, self.head_dim)), cis)
        kv = apply_rope(self.kv_norm(self.wkv(x)), cis)                      # [B, γ, D]
        if ctx.quant_sim:
            kv = fp8_qdq(kv)
        ring = ctx.rings[self.layer]                                         # [B, slots, D]
        slots = ring.size(1)
        block = slots + torch.arange(S, device=x.device)                     # the block's own rows
        idx = torch.cat([ctx.ring_index, block.expand(B, S)], -1)            # [B, K + γ], same for every query
        idx = idx.unsqueeze(1).expand(B, S, idx.size(-1))                    # [B, γ, K + γ]
        o = sparse_attn(q, torch.cat([ring, kv.to(ring.dtype)], 1), self.attn_sink, idx, self.scale)
        o = apply_rope(o, cis, inverse=True)
        o = o.reshape(B, S, self.groups, -1)                                 # [B, γ, G, H·D/G]
        wo_a = self.wo_a.weight.view(self.groups, self.o_rank, -1)          # [G, o_rank, H·D/G]
        z = torch.einsum("bsgd,grd->bsgr", o.to(wo_a.dtype), wo_a)           # [B, γ, G, o_rank]
        return self.wo_b(z.flatten(2))


class DraftStage(Block):
    """An ordinary block (ratio 0, drafter expert counts) plus stage 0's main_proj/main_norm and the
    last stage's norm, Markov head and confidence head."""

    def __init__(self, args, role, stage: int, dtype=None, device=None):
        super().__init__(args, role, dtype=dtype, device=device)
        kw = dict(dtype=dtype, device=device)
        self.attn = DraftAttention(args, role, **kw)
        if stage == 0:
            self.main_proj = Linear(args.dim * len(args.dspark_target_layer_ids), args.dim, quantized=True, **kw)
            self.main_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        if stage == args.n_draft_stages - 1:
            self.norm = RMSNorm(args.dim, args.norm_eps, **kw)
            self.markov_head = MarkovHead(args, **kw)
            self.confidence_head = ConfidenceHead(args, **kw)


def main_features(model, taps: torch.Tensor) -> torch.Tensor:
    """main_hidden [B, S, n_taps·dim] → main_x = main_norm(main_proj(·)) [B, S, dim] (stage 0's modules)."""
    s0 = model.mtp[0]
    return s0.main_norm(s0.main_proj(taps.to(model.dtype)))


def draft_hidden(model, ids: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
    """Draft block ids [B, γ] ([anchor, noise, …]) through every stage → Hd [B, γ, dim], the collapse of the
    last stage's streams with its ffn `pre` (pre-norm)."""
    a = model.args
    B, S = ids.shape
    x = model.embed(ids).unsqueeze(2).repeat(1, 1, a.hc_mult, 1)             # [B, γ, hc, dim]
    pre = torch.zeros(B, S, a.hc_mult, dtype=upcast(x).dtype, device=x.device)
    pre[..., 0] = 1.0                                                        # the drafter restarts from one-hot
    for stage in model.mtp:
        x, pre = stage(x, pre, ctx)
    return collapse(x, pre)
