"""FastMoE: the reference MoE whose routed experts run densely, gathered or sorted, whichever is fastest here."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.moe import MoE, swiglu
from ..model.norm import upcast
from ..model.quant import fp8_qdq
from .expert_stacks import ExpertStacks
from .sync_free import sync_free_active

# Routed experts with at most this many weight elements in all run densely when no gradient is needed: every
# expert on every token in two matmuls, unchosen experts weighted 0. For small models one big matmul beats
# gathering or looping over experts (one-off measurement on default-small: 0.6 vs 1.4 ms at 1 token, 1.5 vs
# 4 ms at 6); a full-size model (V4.1-Flash: 6.4G expert elements per layer) never takes this path.
DENSE_MAX_ELEMENTS = 4 * 1024 * 1024


class FastMoE(MoE):
    """MoE.forward unchanged; routed_experts picks a path per call. With autograd on: the reference (sorted).
    Otherwise small models run every expert densely (unless their inputs are FP8-quantized, which the dense
    matmul would skip); a call with no more (token, slot) pairs than experts, or any call under sync_free(),
    gathers the chosen experts' weights into one batched matmul; the rest is the reference's sorted loop."""

    stacks: ExpertStacks
    dense_ok: bool

    @classmethod
    def adopt(cls, moe: MoE) -> "FastMoE":
        """Turn `moe` (a MoE or any FastMoE) into this class in place: same parameters and state dict; a
        reference MoE gets empty weight caches."""
        if not isinstance(moe, FastMoE):
            moe.stacks = ExpertStacks()
            moe.dense_ok = moe.n_experts * moe.experts[0].w1.weight.numel() * 3 <= DENSE_MAX_ELEMENTS
        moe.__class__ = cls
        return moe

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gate.weight.requires_grad:
            return super().routed_experts(x, weights, ids)
        if self.dense_ok and not self.experts[0].w1.act_quant:
            return self.dense_experts(x, weights, ids)
        if sync_free_active() or x.size(0) * self.topk <= self.n_experts:
            return self.gathered_experts(x, weights, ids)
        return super().routed_experts(x, weights, ids)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """W1 [E, inter, dim], W2 [E, dim, inter], W3 [E, inter, dim] (cached; rebuilt after a weight changes)."""
        return self.stacks.stacked(self.experts)

    def gathered_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Decode: gather the chosen experts' weights and run all (token, slot) pairs in one batched matmul."""
        w1, w2, w3 = self.stacked()
        act_quant = self.experts[0].w1.act_quant
        xin = fp8_qdq(x) if act_quant else x
        xin = xin.to(w1.dtype).unsqueeze(1).unsqueeze(-1)                     # [N, 1, dim, 1]
        g = torch.matmul(w1[ids], xin).squeeze(-1)                            # [N, k, inter]
        u = torch.matmul(w3[ids], xin).squeeze(-1)
        h = swiglu(upcast(g), upcast(u), self.limit, weights.unsqueeze(-1)).to(x.dtype)
        if act_quant:
            h = fp8_qdq(h)
        y = torch.matmul(w2[ids], h.to(w2.dtype).unsqueeze(-1)).squeeze(-1)  # [N, k, dim]
        return upcast(y).sum(1)

    def dense_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Small models: every expert on every token, the router's weights scattered over [N, E] (0 = unchosen),
        so y = Σ_chosen w_e · W2_e · swiglu(W1_e x, W3_e x) in one up and one down matmul."""
        w13, w2 = self.stacks.dense(self.experts)
        N, E = x.size(0), self.n_experts
        gu = upcast(F.linear(x.to(w13.dtype), w13)).view(N, 2, E, -1)        # [N, 2, E, inter]
        dense_w = torch.zeros(N, E, dtype=weights.dtype, device=x.device).scatter_(1, ids, weights)
        h = swiglu(gu[:, 0], gu[:, 1], self.limit, dense_w.unsqueeze(-1))     # [N, E, inter]
        return upcast(F.linear(h.reshape(N, -1).to(w2.dtype), w2))           # [N, dim]
