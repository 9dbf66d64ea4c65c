"""FastMoE: the reference MoE whose experts run by expert or gathered (few tokens), dense (small models) or sorted."""
from __future__ import annotations

from itertools import accumulate

import torch
import torch.nn.functional as F

from ..model.linear import Linear
from ..model.moe import MoE, swiglu
from ..model.norm import upcast
from .casts import cast
from .cpu_bf16 import copy_pays, linear, mm
from .derived import derived
from .expert_stacks import ExpertStacks
from .fast_linear import FastLinear
from .fast_quant import fp8_qdq
from .fused_experts import FusedExperts
from .sync_free import sync_free_active

# Routed experts with at most this many weight elements in all run densely when no gradient is needed and a call
# has too many tokens to gather (FastMoE.gathers): every expert on every token in two matmuls, unchosen experts
# weighted 0. For small models one big matmul beats gathering or looping over experts beyond a few tokens; a
# full-size model (V4.1-Flash: 6.4G expert elements per layer) never takes this path.
DENSE_MAX_ELEMENTS = 4 * 1024 * 1024
# The CPU's by-expert loop (FastMoE.sorted_pairs) costs a few ops per chosen expert, about as long as this many
# multiply-adds (some 30 µs on one core); the dense path costs every expert's multiply-adds on every token. A small
# model's call sorts once the dense path's extra multiply-adds exceed that cost for every expert: default-small's
# 16 experts from 14 tokens on (its prefills), tiny-v4.1's 8 narrow ones from 147.
SORT_OPS_MACS = 600_000


def _plain(linear) -> bool:
    return type(linear) in (Linear, FastLinear)


class FastMoE(MoE):
    """MoE.forward, except that a call of few tokens (decode, a DSpark verify block; `gathers`, and on the CPU
    `sorts`) runs the chosen experts and the shared expert together as (token, slot) pairs of one [E + 1, …]
    stack (the shared expert last, weight 1): on the CPU grouped by expert, each expert's slices read in place
    (sorted_pairs); elsewhere gathered into two batched matmuls, which needs no host read. routed_experts picks
    a path per call: with autograd on, the reference (sorted); few pairs gather; more run every expert densely
    in small models (unless their inputs are FP8-quantized, which the dense matmul would skip; forward puts the
    shared expert into the same two matmuls), gather under sync_free(), and else take the reference's sorted
    loop. The stacks are copies of the experts' parameters (engine.speedups.fused_experts), which stay the state
    dict."""

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

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None, tokens: torch.Tensor | None = None,
                steer: torch.Tensor | None = None):
        N = x.numel() // x.size(-1)
        by_expert = x.device.type == "cpu" and not sync_free_active()
        pairs = self.gathers(N) or by_expert and self.sorts(N)
        dense = not pairs and self.runs_densely()
        if (not (pairs or dense) or (torch.is_grad_enabled() and self.gate.weight.requires_grad)
                or not self._shared_stacks_with_routed() or (steer is not None and self.hash_routed)):
            return super().forward(x, vision, tokens, steer)
        # the router takes any leading shape: weights, ids and scores come out [B, S, k] as MoE.forward returns them
        if self.hash_routed:
            weights, ids, scores = self.gate(x, tokens)
        else:
            weights, ids, scores = self.gate(x, vision, steer)   # steer: interventions' banned / forced experts
        if dense:
            y = self.dense_experts(x.view(N, -1), weights.view(N, -1), ids.view(N, -1), shared=True)
            return cast(y, x.dtype).view(x.shape), (weights, ids, scores)
        # the shared expert is expert E of the stack, chosen by every token with weight 1 (h · 1 = h exactly)
        pick = F.pad(ids, (0, 1), value=self.n_experts).view(-1)                      # [N·(k + 1)], token-major
        pair_weights = F.pad(weights, (0, 1), value=1.0).view(-1, 1)
        if by_expert:
            y = self.sorted_pairs(x.view(N, -1), pair_weights, pick, N)
        else:
            y = self.gathered_pairs(x.view(N, -1), pair_weights, pick, N)
        return cast(y, x.dtype).view(x.shape), (weights, ids, scores)

    def runs_densely(self) -> bool:
        """Whether calls beyond the gathered and by-expert sizes run every expert on every token: small experts
        (dense_ok) whose inputs are not FP8-quantized, a rounding the dense matmul would skip."""
        return self.dense_ok and not self.experts[0].w1.act_quant

    def gathers(self, n_tokens: int) -> bool:
        """Whether a call of n_tokens gathers its experts' weights: when its (token, slot) pairs are at most the
        experts (the reference's rule), and for small models only while the copies (written, then read) cost
        less than reading every expert once (the dense path): 2 · pairs ≤ E + 1."""
        pairs = n_tokens * self.topk
        if torch.compiler.is_compiling():  # compiled code: gathering stays cheaper than every expert on every token
            return n_tokens * (self.topk + 1) <= 2 * (self.n_experts + 1)
        if self.runs_densely():
            return 2 * n_tokens * (self.topk + 1) <= self.n_experts + 1
        return pairs <= self.n_experts

    def sorts(self, n_tokens: int) -> bool:
        """Whether a call of n_tokens on the CPU runs its pairs by expert (sorted_pairs): while they are at most
        twice the experts, and in a small model while the dense path's products for the experts a token did not
        choose cost more than the loop's ops for every expert (SORT_OPS_MACS); beyond, the dense path reads every
        expert in fewer ops (and a large model's reference loop is the same sort)."""
        if n_tokens * (self.topk + 1) <= 2 * (self.n_experts + 1):
            return True
        expert_macs = 3 * self.experts[0].w1.weight.numel()                   # W1, W3 [inter, dim], W2 [dim, inter]
        return (self.runs_densely()
                and n_tokens * (self.n_experts - self.topk) * expert_macs > SORT_OPS_MACS * (self.n_experts + 1))

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.gate.weight.requires_grad:
            return super().routed_experts(x, weights, ids)
        if self.gathers(x.size(0)):
            return self.gathered_experts(x, weights, ids)
        if self.runs_densely():
            return self.dense_experts(x, weights, ids)
        if sync_free_active():
            return self.gathered_experts(x, weights, ids)
        return super().routed_experts(x, weights, ids)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """W1 [E, inter, dim], W2 [E, dim, inter], W3 [E, inter, dim] (cached; rebuilt after a weight changes):
        the layout the Triton kernels index."""
        return self.stacks.stacked(self.experts)

    def fused(self, used: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """W13 [E + 1, 2·inter, dim] (each expert's W1 rows, then its W3 rows) and W2ᵀ [E + 1, inter, dim], the
        routed experts then the shared one, copied from the parameters and current for the experts in `used`
        (default all; engine.speedups.fused_experts)."""
        stacks = self.__dict__.get("fused_experts")
        if stacks is None:
            stacks = self.__dict__["fused_experts"] = FusedExperts()
        return stacks.stacks([*self.experts._modules.values(), self.shared_experts], used)

    def fused_for(self, rows: int, used: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """fused(used) for products of up to `rows` rows with one expert's weights (or as many multiply-adds):
        where the stacks are fp32 copies of bf16 experts and a product that large runs faster in bf16
        (engine.speedups.cpu_bf16.copy_pays), bf16 copies of them (exact, made once, rebuilt when the stacks
        change)."""
        w13, w2t = self.fused(used)
        dtype = self.fused_experts.param_dtype
        if w13.dtype == dtype or copy_pays(rows, w13[0]):
            return w13, w2t
        cache = derived(self)
        return (cache.get("w13:param", (w13,), lambda: w13.to(dtype)),
                cache.get("w2t:param", (w2t,), lambda: w2t.to(dtype)))

    def _stack_input(self, x: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        """x as the experts' weights take it (cast to their dtype, as Linear does), in the stacks' dtype."""
        return cast(cast(x, self.fused_experts.param_dtype), w13.dtype)

    def _rounded(self, product: torch.Tensor) -> torch.Tensor:
        """A product with the stacks, rounded to the experts' weights' dtype, as their own kernels return it (a
        no-op unless the stacks are fp32 copies of bf16 experts)."""
        return cast(product, self.fused_experts.param_dtype)

    def _shared_stacks_with_routed(self) -> bool:
        """The shared expert can join the routed ones' stack: plain weights of the same dtype and the same FP8
        input rounding (a checkpoint may keep the shared expert in another format than the routed ones)."""
        s, e = self.shared_experts, self.experts[0]
        return (_plain(s.w1) and _plain(s.w2) and _plain(s.w3) and s.w1.act_quant == e.w1.act_quant
                and s.w1.weight.dtype == e.w1.weight.dtype)

    def gathered_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Decode: gather the chosen experts' weights (ids [N, k] into the fused stack; E names the shared expert)
        and run all (token, slot) pairs in two batched matmuls → Σ_j weights[:, j] · expert_{ids[:, j]}(x)
        [N, dim] fp32."""
        return self.gathered_pairs(x, weights.reshape(-1, 1), ids.reshape(-1), x.size(0))

    def gathered_pairs(self, x: torch.Tensor, weights: torch.Tensor, pick: torch.Tensor, N: int) -> torch.Tensor:
        """x [N, dim]; the (token, slot) pairs token-major: pick [N·k] expert ids, weights [N·k, 1] → [N, dim]
        fp32."""
        w13, w2t = self.fused()
        P, inter = pick.size(0), w2t.size(1)
        act_quant = self.experts[0].w1.act_quant
        xin = self._stack_input(fp8_qdq(x) if act_quant else x, w13)
        w = w13.index_select(0, pick)                                         # [P, 2·inter, dim]
        # one matrix-vector product per pair; a stride-0 broadcast of x would take a slow batched-matmul path
        xs = xin.view(-1) if N == 1 else xin.repeat_interleave(P // N, 0).unsqueeze(-1)   # [dim] or [P, dim, 1]
        gu = self._rounded(torch.matmul(w, xs).view(P, -1))                  # [P, 2·inter]
        h = cast(swiglu(upcast(gu[:, :inter]), upcast(gu[:, inter:]), self.limit, weights), x.dtype)
        if act_quant:
            h = fp8_qdq(h)
        y = self._rounded(torch.bmm(cast(h, w2t.dtype).unsqueeze(1), w2t.index_select(0, pick)))   # [P, 1, dim]
        return upcast(y).view(N, P // N, -1).sum(1)

    def sorted_pairs(self, x: torch.Tensor, weights: torch.Tensor, pick: torch.Tensor, N: int) -> torch.Tensor:
        """gathered_pairs on the CPU without copying weights: the pairs grouped by expert (one host read of the
        counts), each chosen expert's slices of the fused stacks read in place by one up and one down matmul
        over its tokens, the results put back in token-major pair order and summed per token as gathered_pairs
        sums them. x [N, dim], pick [N·k] token-major, weights [N·k, 1] → [N, dim] fp32."""
        k = pick.size(0) // N
        if N == 1:  # the pairs name k different experts: no sorting
            order, experts = None, pick.tolist()
            spans = [(e, j, 1) for j, e in enumerate(experts)]
        else:
            order = pick.argsort(stable=True)                                 # pairs grouped by expert
            counts = torch.bincount(pick, minlength=self.n_experts + 1).tolist()
            ends = list(accumulate(counts))
            spans = [(e, ends[e] - n, n) for e, n in enumerate(counts) if n]   # (expert, first pair, pairs)
            experts = [e for e, _, _ in spans]
        w13, w2t = self.fused_for(N, experts)
        inter = w2t.size(1)
        act_quant = self.experts[0].w1.act_quant
        xin = self._stack_input(fp8_qdq(x) if act_quant else x, w13)
        xs = xin.expand(k, -1) if order is None else xin[order // k]          # [P, dim] each pair's token
        gu = self._rounded(torch.cat([linear(xs[b:b + n], w13[e]) for e, b, n in spans]))   # [P, 2·inter]
        ws = weights if order is None else weights[order]
        h = cast(swiglu(upcast(gu[:, :inter]), upcast(gu[:, inter:]), self.limit, ws), x.dtype)
        if act_quant:
            h = fp8_qdq(h)
        h = cast(h, w2t.dtype)
        y = self._rounded(torch.cat([mm(h[b:b + n], w2t[e]) for e, b, n in spans]))   # [P, dim] by expert
        if order is not None:
            y = torch.empty_like(y).index_copy_(0, order, y)                  # token-major again
        return upcast(y).view(N, k, -1).sum(1)

    def dense_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                      shared: bool = False) -> torch.Tensor:
        """Small models: every expert on every token, the router's weights scattered over [N, E] (0 = unchosen),
        so y = Σ_chosen w_e · W2_e · swiglu(W1_e x, W3_e x) in one up and one down matmul; `shared`: the shared
        expert too, as stack entry E with weight 1 (its output joins the sum inside the down matmul)."""
        N = x.size(0)
        E = self.n_experts + int(shared)
        w13, w2t = self.fused_for(N * E)                                      # one product over all E experts
        inter = w2t.size(1)
        gu = linear(self._stack_input(x, w13), w13[:E].view(-1, w13.size(-1)))
        gu = upcast(self._rounded(gu)).view(N, E, 2, inter)                      # [N, E, 2, inter]
        dense_w = torch.zeros(N, E, dtype=weights.dtype, device=x.device).scatter_(1, ids, weights)
        if shared:
            dense_w[:, -1] = 1.0
        h = swiglu(gu[:, :, 0], gu[:, :, 1], self.limit, dense_w.unsqueeze(-1))   # [N, E, inter]
        h = cast(cast(h, self.fused_experts.param_dtype), w2t.dtype).reshape(N, -1)
        return upcast(self._rounded(mm(h, w2t[:E].view(E * inter, -1))))     # [N, dim]


def build_expert_stacks(root: torch.nn.Module) -> None:
    """Make every FastMoE under `root` build its fused expert stacks now, or refresh the slices of experts whose
    weights changed: compiled code neither builds nor checks them (a decode body compiled before any eager forward
    would otherwise break its graph there, and would keep reading stale copies after an in-place weight update)."""
    for module in root.modules():
        if isinstance(module, FastMoE):
            module.fused()
