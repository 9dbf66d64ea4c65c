"""MoE (spec §4.5): sqrt-softplus router with selection-only bias (or V4's hash table), SwiGLU experts with clamp,
shared expert."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..spec.roles import family_roles
from .linear import Linear
from .norm import upcast

Routing = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # a gate's (weights, expert ids, chosen scores) [B, S, k]


def route_weights(gate: Gate | HashGate, chosen: torch.Tensor) -> torch.Tensor:
    """Routing weights from the unbiased scores of the chosen experts [N, k]: renormalised, times route_scale."""
    weights = chosen
    if gate.norm_topk and gate.topk > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * gate.route_scale


class Gate(nn.Module):
    def __init__(self, args: ModelArgs, n_experts: int, topk: int, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.topk, self.route_scale, self.temp = topk, args.route_scale, args.gate_temp
        self.norm_topk = args.norm_topk_prob
        fp32 = torch.float64 if dtype == torch.float64 else torch.float32
        self.weight = nn.Parameter(torch.empty(n_experts, args.dim, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(n_experts, dtype=fp32, device=device))
        if family_roles(args).vision_bias:  # V4.1 with a vision tower: image tokens select with their own bias
            self.bias_vl = nn.Parameter(torch.zeros(n_experts, dtype=fp32, device=device))

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None,
                steer: torch.Tensor | None = None) -> Routing:
        """x [N, dim] → (weights [N, k], ids [N, k], raw scores of the chosen [N, k]). steer [N, E]: interventions
        (engine.model.interventions), −inf bans an expert from the selection and +inf forces it in."""
        logits = F.linear(upcast(x), upcast(self.weight)) / self.temp
        return self.route(F.softplus(logits).sqrt(), vision, steer)        # "sqrtsoftplus", fp32

    def route(self, scores: torch.Tensor, vision: torch.Tensor | None, steer: torch.Tensor | None) -> Routing:
        """scores [N, E] → (weights, ids, chosen scores) [N, k]: the top-k of scores + bias, steered."""
        bias = self.bias if vision is None else torch.where(vision.unsqueeze(-1), self.bias_vl, self.bias)
        selection = scores + bias                                            # the bias only selects
        if steer is not None:  # intervention: banned experts cannot be chosen, forced ones always are
            selection = selection + steer
        ids = selection.topk(self.topk, dim=-1).indices
        chosen = scores.gather(-1, ids)                                      # weights as for any chosen expert
        return route_weights(self, chosen), ids, chosen


class HashGate(nn.Module):
    """V4 hash routing (spec §11, the first n_hash_layers layers): a fixed table `tid2eid` [vocab, k] names each
    token id's experts; the learned weight only scores them (the same sqrt-softplus weights as Gate, no bias)."""

    def __init__(self, args: ModelArgs, n_experts: int, topk: int, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.topk, self.route_scale, self.temp = topk, args.route_scale, args.gate_temp
        self.norm_topk = args.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(n_experts, args.dim, dtype=dtype, device=device))
        self.register_buffer("tid2eid", torch.zeros(args.vocab_size, topk, dtype=torch.long, device=device))

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> Routing:
        """x [N, dim], tokens [N] ids → (weights [N, k], ids [N, k], raw scores of the chosen [N, k])."""
        logits = F.linear(upcast(x), upcast(self.weight)) / self.temp
        scores = F.softplus(logits).sqrt()
        ids = self.tid2eid[tokens.to(self.tid2eid.device)].to(x.device)      # the token picks, not the scores
        chosen = scores.gather(-1, ids)
        return route_weights(self, chosen), ids, chosen


class Expert(nn.Module):
    """SwiGLU FFN; the up branch is clamped to ±limit, the gate branch from above only."""

    def __init__(self, dim: int, inter: int, limit: float, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
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


class MoE(nn.Module):
    def __init__(self, args: ModelArgs, n_experts: int, topk: int, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None,
                 hash_routed: bool = False) -> None:
        super().__init__()
        self.n_experts, self.topk, self.limit = n_experts, topk, args.swiglu_limit
        self.hash_routed = hash_routed
        self.gate = (HashGate if hash_routed else Gate)(args, n_experts, topk, dtype=dtype, device=device)
        self.experts = nn.ModuleList(Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, dtype=dtype, device=device)
                                     for _ in range(n_experts))
        self.shared_experts = Expert(args.dim, args.moe_inter_dim, args.swiglu_limit, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None, tokens: torch.Tensor | None = None,
                steer: torch.Tensor | None = None) -> tuple[torch.Tensor, Routing]:
        """x [B, S, dim], vision [B, S] (image tokens), tokens [B, S] (ids; a hash-routed MoE needs them), steer
        [B, S, E] (interventions' banned / forced experts, see Gate) → (y [B, S, dim], (weights, ids, scores) each
        [B, S, k])."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])                                       # [N, dim]
        if self.hash_routed:
            if tokens is None:
                raise InputError("a hash-routed MoE (V4's first n_hash_layers layers) needs the token ids")
            if steer is not None:
                raise InputError("a hash-routed MoE (V4's first n_hash_layers layers) cannot ban or force experts: "
                                 "the token id picks them")
            weights, ids, scores = self.gate(flat, tokens.reshape(-1))
        else:
            weights, ids, scores = self.gate(flat, None if vision is None else vision.reshape(-1),
                                             None if steer is None else steer.reshape(flat.size(0), -1))
        y = self.routed_experts(flat, weights, ids) + upcast(self.shared_experts(flat))
        k = ids.size(-1)
        return y.to(x.dtype).view(shape), (weights.view(*shape[:-1], k), ids.view(*shape[:-1], k),
                                           scores.view(*shape[:-1], k))

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, dim], weights and ids [N, k] → Σ_j weights[:, j] · expert_{ids[:, j]}(x) [N, dim] (fp32):
        each chosen expert runs once, on its own tokens (the (token, slot) pairs sorted by expert, so that
        each expert reads one contiguous slice)."""
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
