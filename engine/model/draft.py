"""DSpark drafter stages `mtp.{s}` (spec §7): ordinary blocks whose attention reads a ring of tapped target
features plus the whole draft block (non-causal inside it), and the last stage's Markov and confidence heads
(V4: and its own hc_head, which collapses the draft streams)."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from ..spec.config import ModelArgs
from ..spec.roles import LayerRole, family_roles
from .attention import Attention
from .block import Block
from .interventions import NONE, Interventions
from .linear import Linear
from .mhc import HCHead, collapse
from .norm import RMSNorm, upcast
from .rope import apply_rope
from .sparse_attn import sparse_attn

if TYPE_CHECKING:  # the model holds the drafter's stages: named for annotations only
    from .transformer import Transformer

T = TypeVar("T")


class MarkovHead(nn.Module):
    """W1 [V, r] (an embedding of the previous token) and W2 [V, r], named as the family's checkpoint names them:
    V4.1 `embed` / `head`, the V4-DSpark files `markov_w1` / `markov_w2`."""

    def __init__(self, args: ModelArgs, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.w1_name, self.w2_name = family_roles(args).markov_names
        setattr(self, self.w1_name, nn.Embedding(args.vocab_size, args.dspark_markov_rank, dtype=dtype, device=device))
        setattr(self, self.w2_name, Linear(args.dspark_markov_rank, args.vocab_size, dtype=dtype, device=device))

    @property
    def w1(self) -> nn.Embedding:
        return getattr(self, self.w1_name)

    @property
    def w2(self) -> Linear:
        return getattr(self, self.w2_name)

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev [B] token ids → (e [B, r] the W1 row, bias [B, V] fp32 added to the base logits)."""
        e = self.w1(prev)
        return e, F.linear(upcast(e), upcast(self.w2.weight))


class ConfidenceHead(nn.Module):
    def __init__(self, args: ModelArgs, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
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
    interventions: Interventions = NONE   # what-if changes; the drafter reads drop-stage (backbone ones reach it
                                          # through the target's taps)

    def cached(self, key: Hashable, make: Callable[[], T]) -> T:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def trace_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, positions) as the Trace receives them (a CUDA-graph draft body's context,
        engine.graphs.static_context, passes the device tensors as they are)."""
        return self.rows, self.cached("positions_cpu", lambda: self.positions.cpu())


class DraftAttention(Attention):
    """The backbone's attention modules (same parameter names) with the drafter's key set: every block
    query reads every valid ring row and every row of the block."""

    def ring_kv(self, main_x: torch.Tensor, positions: torch.Tensor, quant: bool) -> torch.Tensor:
        """main_x [B, S, dim] at absolute positions [B, S] → ring rows [B, S, head_dim] (spec §7 prefill)."""
        kv = apply_rope(self.kv_norm(self.wkv(main_x)), self.rotary.cis(positions))
        return self.quant_kv(kv) if quant else kv

    def forward(self, x: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """x [B, γ, dim] (normed collapse of the block's streams) → [B, γ, dim]."""
        B, S, _ = x.shape
        cis = ctx.cached(("cis", self.rotary.key), lambda: self.rotary.cis(ctx.positions))  # [B, γ, rope/2]
        q = self.queries(x, cis)[0]                                          # [B, γ, H, D]
        kv = apply_rope(self.kv_norm(self.wkv(x)), cis)                      # [B, γ, D]
        if ctx.quant_sim:
            kv = self.quant_kv(kv)
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


class DraftStage(Block, HCHead):
    """An ordinary block (ratio 0, drafter expert counts) plus stage 0's main_proj/main_norm and the
    last stage's norm, Markov head and confidence head (V4: and hc_head_{fn,base,scale})."""

    def __init__(self, args: ModelArgs, role: LayerRole, stage: int, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
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
            if family_roles(args).hc_head:
                self.add_hc_head(args, **kw)


class MTPStage(Block, HCHead):
    """A plain multi-token-prediction layer `mtp.{s}` (V4-Flash without DSpark): a block plus its embedding and
    hidden projections (e_proj, h_proj) with their norms, its own norm and hc_head. Built so that such a
    checkpoint loads name for name (and converts to the official layout); the engine drafts with DSpark only
    and does not run it."""

    def __init__(self, args: ModelArgs, role: LayerRole, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(args, role, dtype=dtype, device=device)
        kw = dict(dtype=dtype, device=device)
        self.enorm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.hnorm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.e_proj = Linear(args.dim, args.dim, quantized=True, **kw)
        self.h_proj = Linear(args.dim, args.dim, quantized=True, **kw)
        self.norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.add_hc_head(args, **kw)


def main_features(model: Transformer, taps: torch.Tensor) -> torch.Tensor:
    """main_hidden [B, S, n_taps·dim] → main_x = main_norm(main_proj(·)) [B, S, dim] (stage 0's modules)."""
    s0 = model.mtp[0]
    return s0.main_norm(s0.main_proj(taps.to(model.dtype)))


def draft_hidden(model: Transformer, ids: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
    """Draft block ids [B, γ] ([anchor, noise, …]) through every stage → Hd [B, γ, dim], the collapse of the
    last stage's streams (pre-norm): with its ffn `pre` (V4.1), with its own hc_head (V4)."""
    a = model.args
    B, S = ids.shape
    x = model.embed(ids).unsqueeze(2).repeat(1, 1, a.hc_mult, 1)             # [B, γ, hc, dim]
    pre = torch.zeros(B, S, a.hc_mult, dtype=upcast(x).dtype, device=x.device)
    pre[..., 0] = 1.0                                                        # the drafter restarts from one-hot
    for s, stage in enumerate(model.mtp):
        dropped = ctx.interventions.stage_dropped(s, ctx.positions)        # [B, γ] or None
        if dropped is None:
            x, pre = stage(x, pre, ctx)
        elif not bool(dropped.all()):  # intervention: where the stage is dropped, its input passes through
            out, out_pre = stage(x, pre, ctx)
            x, pre = torch.where(dropped[..., None, None], x, out), torch.where(dropped[..., None], pre, out_pre)
        # dropped at every position of the block: the stage does not run (and records nothing)
    return model.mtp[-1].hc_head(x) if family_roles(a).hc_head else collapse(x, pre)
