"""MoE (spec §4.5): sqrt-softplus router with selection-only bias, SwiGLU experts with clamp, shared expert."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear
from .norm import upcast
from .quant import fp8_qdq


class Gate(nn.Module):
    def __init__(self, args, n_experts: int, topk: int, dtype=None, device=None):
        super().__init__()
        self.topk, self.route_scale, self.temp = topk, args.route_scale, args.gate_temp
        self.norm_topk = args.norm_topk_prob
        fp32 = torch.float64 if dtype == torch.float64 else torch.float32
        self.weight = nn.Parameter(torch.empty(n_experts, args.dim, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(n_experts, dtype=fp32, device=device))
        self.bias_vl = nn.Parameter(torch.zeros(n_experts, dtype=fp32, device=device))

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None):
        """x [N, dim] → (weights [N, k], ids [N, k], raw scores of the chosen [N, k])."""
        logits = F.linear(upcast(x), upcast(self.weight)) / self.temp
        scores = F.softplus(logits).sqrt()                                   # "sqrtsoftplus", fp32
        bias = self.bias if vision is None else torch.where(vision.unsqueeze(-1), self.bias_vl, self.bias)
        ids = (scores + bias).topk(self.topk, dim=-1).indices                # the bias only selects
        chosen = scores.gather(-1, ids)
        weights = chosen
        if self.norm_topk and self.topk > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.route_scale, ids, chosen


class Expert(nn.Module):
    """SwiGLU FFN; the up branch is clamped to ±limit, the gate branch from above only."""

    def __init__(self, dim: int, inter: int, limit: float, dtype=None, device=None):
        super().__init__()
        self.limit = limit
        self.w1 = Linear(dim, inter, quantized=True, dtype=dtype, device=device)
        self.w2 = Linear(inter, dim, quantized=True, dtype=dtype, device=device)
        self.w3 = Linear(dim, inter, quantized=True, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.w2(swiglu(upcast(self.w1(x)), upcast(self.w3(x)), self.limit, weights).to(x.dtype))


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, weights: torch.Tensor | None) -> torch.Tensor:
    if limit > 0:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    h = F.silu(gate) * up
    return h if weights is None else h * weights                              # weight applied before w2


# Routed experts with at most this many weight elements in all run densely when no gradient is needed: every
# expert on every token in two matmuls, unchosen experts weighted 0. For small models one big matmul beats
# gathering or looping over experts (measured on default-small: 0.6 vs 1.4 ms at 1 token, 1.5 vs 4 ms at 6);
# a full-size model (V4.1-Flash: 6.4G expert elements per layer) never takes this path.
DENSE_MAX_ELEMENTS = 4 * 1024 * 1024


class MoE(nn.Module):
    def __init__(self, args, n_experts: int, topk: int, dtype=None, device=None):
        super().__init__()
        self.n_experts, self.topk, self.limit = n_experts, topk, args.swiglu_limit
        self.gate = Gate(args, n_experts, topk, dtype=dtype, device=device)
        self.experts = nn.ModuleList(Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, dtype=dtype, device=device)
                                     for _ in range(n_experts))
        self.shared_experts = Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, dtype=dtype, device=device)
        self._stack_key = None
        self._stack: tuple[torch.Tensor, ...] = ()
        self._dense_key = None
        self._dense: tuple[torch.Tensor, torch.Tensor] = ()
        self.dense_ok = n_experts * args.moe_inter_dim * args.dim * 3 <= DENSE_MAX_ELEMENTS

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None, gathered: bool = False):
        """x [B, S, dim] → (y [B, S, dim], (weights, ids, scores) each [B, S, k]). gathered: take a path that
        never syncs with the host whatever the token count (dense or gathered; static-shape decode)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])                                       # [N, dim]
        weights, ids, scores = self.gate(flat, None if vision is None else vision.reshape(-1))
        needs_grad = torch.is_grad_enabled() and self.gate.weight.requires_grad
        if self.dense_ok and not needs_grad and not flat.is_meta and not self.experts[0].w1.act_quant:
            y = self._dense_all(flat, weights, ids)
        elif (gathered or flat.size(0) * self.topk <= self.n_experts or flat.is_meta) and not needs_grad:
            y = self._gathered(flat, weights, ids)
        else:
            y = self._sorted(flat, weights, ids)
        y = y + upcast(self.shared_experts(flat))
        k = ids.size(-1)
        return y.to(x.dtype).view(shape), (weights.view(*shape[:-1], k), ids.view(*shape[:-1], k),
                                           scores.view(*shape[:-1], k))

    def _sorted(self, x, weights, ids) -> torch.Tensor:
        """Prefill path: sort (token, slot) pairs by expert once, run each used expert on a contiguous slice."""
        order = ids.flatten().argsort(stable=True)
        token = order // self.topk
        counts = torch.bincount(ids.flatten(), minlength=self.n_experts).tolist()
        xs, ws = x[token], weights.flatten()[order].unsqueeze(-1)
        out = torch.zeros(x.size(0), x.size(1), dtype=upcast(x).dtype, device=x.device)
        begin = 0
        for e, n in enumerate(counts):
            if n:
                sl = slice(begin, begin + n)
                out.index_add_(0, token[sl], upcast(self.experts[e](xs[sl], ws[sl])))
                begin += n
        return out

    def _gathered(self, x, weights, ids) -> torch.Tensor:
        """Decode path: gather the chosen experts' weights and run all (token, slot) pairs in one bmm."""
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

    def _dense_all(self, x, weights, ids) -> torch.Tensor:
        """Small models: every expert on every token, the router's weights scattered over [N, E] (0 = unchosen),
        so y = Σ_chosen w_e · W2_e · swiglu(W1_e x, W3_e x) in one up and one down matmul."""
        w13, w2 = self.dense_weights()
        N, E = x.size(0), self.n_experts
        gu = upcast(F.linear(x.to(w13.dtype), w13)).view(N, 2, E, -1)        # [N, 2, E, inter]
        dense_w = torch.zeros(N, E, dtype=weights.dtype, device=x.device).scatter_(1, ids, weights)
        h = swiglu(gu[:, 0], gu[:, 1], self.limit, dense_w.unsqueeze(-1))     # [N, E, inter]
        return upcast(F.linear(h.reshape(N, -1).to(w2.dtype), w2))           # [N, dim]

    def dense_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[2·E·inter, dim] (all W1 rows, then all W3 rows) and [dim, E·inter] (the W2s side by side), rebuilt
        whenever an expert weight changed."""
        w1, w2, w3 = self.stacked()
        key = self._stack_key  # changes exactly when the stacks were rebuilt
        if key != self._dense_key:
            E, inter, dim = w1.shape
            self._dense = (torch.cat([w1.reshape(E * inter, dim), w3.reshape(E * inter, dim)]),
                           w2.permute(1, 0, 2).reshape(dim, E * inter))     # [dim, E, inter] → [dim, E·inter]
            self._dense_key = key
        return self._dense

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[E, inter, dim], [E, dim, inter], [E, inter, dim] stacks of the experts' weights, rebuilt
        whenever any expert weight was replaced or modified in place."""
        params = [e.w1.weight for e in self.experts] + [e.w2.weight for e in self.experts] + \
                 [e.w3.weight for e in self.experts]
        key = tuple((p.data_ptr(), p._version) for p in params) if not params[0].is_meta else ("meta",)
        if key != self._stack_key:
            with torch.no_grad():
                E = self.n_experts
                self._stack = tuple(torch.stack(params[i * E:(i + 1) * E]) for i in range(3))
            self._stack_key = key
        return self._stack
