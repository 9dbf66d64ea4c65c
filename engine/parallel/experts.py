"""Expert parallelism: each rank holds n_experts / world routed experts and runs them on the tokens routed there."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.moe import MoE, swiglu
from ..model.norm import upcast
from ..quant.modules import QuantMoE
from ..spec.errors import InputError
from ..speedups.expert_stacks import ExpertStacks
from ..speedups.fast_moe import DENSE_MAX_ELEMENTS, FastMoE
from .comm import all_reduce_sum


def expert_parallel(moe: MoE, experts: slice, group, label: str) -> MoE:
    """`moe` turned in place into its expert-parallel form over the experts [experts]: a quantized MoE keeps
    its per-expert dequantization (ExpertParallelQuantMoE), a PyTorch one its speed paths (ExpertParallelMoE)."""
    if isinstance(moe, QuantMoE):
        return ExpertParallelQuantMoE.adopt(moe, experts, group, label)
    return ExpertParallelMoE.adopt(moe, experts, group, label)


def keep_experts(moe: MoE, experts: slice, group, label: str) -> None:
    """`moe` keeps only the experts [experts] (local expert i is global expert `experts.start + i`)."""
    moe.experts = nn.ModuleList(moe.experts[experts])
    moe.n_experts, moe.first, moe.group, moe.label = experts.stop - experts.start, experts.start, group, label


def by_expert(moe: MoE, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """x [N, dim], global weights and ids [N, k] → Σ over the pairs routed to `moe`'s local experts [N, dim] fp32:
    the pairs sorted by expert, each local expert run once on its own tokens (the reference's loop)."""
    local = ids - moe.first
    mine = (local >= 0) & (local < moe.n_experts)
    token, slot = mine.nonzero(as_tuple=True)                              # this rank's (token, slot) pairs
    out = torch.zeros(x.size(0), x.size(1), dtype=upcast(x).dtype, device=x.device)
    if token.numel() == 0:
        return out
    pair_ids, pair_w = local[token, slot], weights[token, slot].unsqueeze(1)   # [P], [P, 1]
    order = pair_ids.argsort(stable=True)
    counts = torch.bincount(pair_ids, minlength=moe.n_experts).tolist()
    begin = 0
    for e, n in enumerate(counts):
        if n:
            pick = order[begin:begin + n]
            out.index_add_(0, token[pick], upcast(moe.experts[e](x[token[pick]], pair_w[pick])))
            begin += n
    return out


class ExpertParallelMoE(FastMoE):
    """MoE.forward unchanged: the router (replicated) picks k of all experts for every token on every rank;
    routed_experts runs this rank's experts on their (token, slot) pairs and one all-reduce sums the ranks'
    partial outputs (fp32, as the reference reduces them); the shared expert, replicated, is added after it.
    `experts` holds this rank's experts only: local expert i is global expert `first + i`."""
    forward = MoE.forward   # not FastMoE's decode shortcut, which runs the experts without the all-reduce
    first: int
    group: object
    label: str

    @classmethod
    def adopt(cls, moe: MoE, experts: slice, group, label: str) -> "ExpertParallelMoE":
        if type(moe) not in (MoE, FastMoE):
            raise InputError(f"{label}: the expert-parallel transform takes the PyTorch MoE, not {type(moe).__name__} "
                             "(distributed runs use --kernels torch)")
        keep_experts(moe, experts, group, label)
        moe.stacks = ExpertStacks()
        moe.dense_ok = moe.n_experts * moe.experts[0].w1.weight.numel() * 3 <= DENSE_MAX_ELEMENTS
        moe.__class__ = cls
        return moe

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(self.local_experts(x, weights, ids), self.group, self.label)

    def local_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, dim], global weights and ids [N, k] → Σ over the pairs routed to this rank's experts [N, dim] fp32."""
        local = ids - self.first
        mine = (local >= 0) & (local < self.n_experts)
        if self.runs_densely() and not torch.is_grad_enabled():
            # small models: every local expert on every token; pairs routed elsewhere land in a spare column
            spare = torch.where(mine, local, self.n_experts)
            dense_w = weights.new_zeros(x.size(0), self.n_experts + 1).scatter_add_(1, spare, weights)
            return self.weighted_dense(x, dense_w[:, :-1])
        token, slot = mine.nonzero(as_tuple=True)                          # this rank's (token, slot) pairs
        if 0 < token.numel() <= self.n_experts:  # decode: the chosen experts' weights gathered, one batched matmul
            pair_ids, pair_w = local[token, slot].unsqueeze(1), weights[token, slot].unsqueeze(1)   # [P, 1]
            out = torch.zeros(x.size(0), x.size(1), dtype=upcast(x).dtype, device=x.device)
            return out.index_add_(0, token, self.gathered_experts(x[token], pair_w, pair_ids))
        return by_expert(self, x, weights, ids)                            # prefill: pairs sorted by expert

    def weighted_dense(self, x: torch.Tensor, dense_w: torch.Tensor) -> torch.Tensor:
        """x [N, dim], dense_w [N, E_local] (0 = not chosen) → Σ_e w_e · W2_e · swiglu(W1_e x, W3_e x) [N, dim]."""
        w13, w2 = self.stacks.dense(self.experts)
        N, E = x.size(0), self.n_experts
        gu = upcast(F.linear(x.to(w13.dtype), w13)).view(N, 2, E, -1)        # [N, 2, E, inter]
        h = swiglu(gu[:, 0], gu[:, 1], self.limit, dense_w.unsqueeze(-1))     # [N, E, inter]
        return upcast(F.linear(h.reshape(N, -1).to(w2.dtype), w2))           # [N, dim]

    def extra_repr(self) -> str:
        return f"experts {self.first}..{self.first + self.n_experts - 1}, expert-parallel (all-reduce)"


class ExpertParallelQuantMoE(QuantMoE):
    """QuantMoE over this rank's experts (FP4Linears): MoE.forward unchanged, the router replicated; each chosen
    local expert dequantizes its own weights when it runs (no stack of experts, packed or dequantized, ever
    exists), and one all-reduce sums the ranks' partial outputs (fp32), as ExpertParallelMoE does."""
    first: int
    group: object
    label: str

    @classmethod
    def adopt(cls, moe: QuantMoE, experts: slice, group, label: str) -> "ExpertParallelQuantMoE":
        keep_experts(moe, experts, group, label)
        moe.__class__ = cls
        return moe

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(by_expert(self, x, weights, ids), self.group, self.label)

    def extra_repr(self) -> str:
        return f"experts {self.first}..{self.first + self.n_experts - 1}, quantized, expert-parallel (all-reduce)"
