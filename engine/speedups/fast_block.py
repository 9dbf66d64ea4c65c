"""FastBlock: Block.forward over the fused mHC seams of engine.speedups.fast_mhc; same parameters and trace calls."""
from __future__ import annotations

import torch

from ..model.block import Block
from ..model.draft import DraftStage
from ..model.norm import upcast
from .casts import cast
from .fast_mhc import collapse, expand, pin_identity, record_seam, seam_mixes


class FastBlock(Block):
    """Block.forward step for step (V4.1's single-pass `pre` hand-on, V4's per-site collapse, the same trace
    records in the same order), with each seam's mixes, collapse and expand in a few ops. The residual streams
    are upcast once per site and rounded back to the activation dtype where the reference rounds them. With
    autograd on, the reference code runs."""

    def forward(self, x: torch.Tensor, pre_in: torch.Tensor, ctx):
        if torch.is_grad_enabled() and (x.requires_grad or self.hc_attn_fn.requires_grad):
            return super().forward(x, pre_in, ctx)
        dtype, xf = x.dtype, upcast(x)                                        # [B, S, hc, D]
        a = pin_identity(self, ctx, seam_mixes(self, xf, "attn"))           # interventions: comb = I there
        if ctx.trace is not None:
            record_seam(self, ctx, "attn", a)
        f = self.attn(self.attn_norm(collapse(xf, pre_in if self.single_pass else a.pre, dtype)), ctx)
        xf = upcast(cast(expand(f, xf, a), dtype))                            # stored in the activation dtype
        s = pin_identity(self, ctx, seam_mixes(self, xf, "ffn"))
        if ctx.trace is not None:
            record_seam(self, ctx, "ffn", s)
        f = self.moe(self.ffn_norm(collapse(xf, a.pre if self.single_pass else s.pre, dtype)), ctx)
        return cast(expand(f, xf, s), dtype), s.pre


class FastDraftStage(DraftStage, FastBlock):
    """A DSpark drafter stage (its extra heads untouched) whose block forward is FastBlock's."""
