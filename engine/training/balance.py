"""Expert load balancing for training: auxiliary-loss-free bias updates and the optional sequence-wise loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.moe import Gate
from ..spec.errors import InputError


class RouterTap:
    """Watches every router of a model during training forwards (a forward hook on each `ffn.gate`).

    Per forward it keeps, by gate path, the expert load (tokens routed to each expert) and, when the
    sequence-wise loss is on, the routers' inputs so the loss can be formed from all experts' scores.
    """

    def __init__(self, model: nn.Module, keep_inputs: bool = False):
        self.gates = {name: m for name, m in model.named_modules() if isinstance(m, Gate)}
        if not self.gates:
            raise InputError("RouterTap: the model has no MoE routers (ffn.gate)")
        self.keep_inputs = keep_inputs
        self.loads: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in self.gates.items()]

    def _hook(self, name: str):
        def record(gate: Gate, inputs, output) -> None:
            ids = output[1]                                                  # [N, k]
            n_experts = gate.weight.size(0)
            load = torch.bincount(ids.flatten(), minlength=n_experts).to(torch.float64)
            self.loads[name] = self.loads[name] + load if name in self.loads else load
            if self.keep_inputs:
                self.inputs[name] = (inputs[0], ids)
        return record

    def reset(self) -> None:
        self.loads.clear()
        self.inputs.clear()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def update_biases(tap: RouterTap, gamma: float) -> dict[str, torch.Tensor]:
    """bias_i += γ·sign(mean load − load_i) for every router that ran (DeepSeek-V3's auxiliary-loss-free
    balancing): an overloaded expert becomes less likely to be selected, an idle one more. The bias only
    affects selection, never the routing weights, so the language-model gradient is untouched."""
    with torch.no_grad():
        for name, load in tap.loads.items():
            bias = tap.gates[name].bias
            step = torch.sign(load.mean() - load).to(bias.dtype)
            bias.add_(gamma * step)
    return dict(tap.loads)


def max_violation(load: torch.Tensor) -> float:
    """MaxVio = (max load − mean load) / mean load: 0 when every expert gets the same number of tokens."""
    mean = load.float().mean()
    return float((load.float().max() - mean) / mean) if mean > 0 else 0.0


def sequence_balance_loss(tap: RouterTap, batch: int) -> torch.Tensor:
    """Sequence-wise balance loss of DeepSeek-V3 (summed over routers): Σ_i f_i·P_i per sequence, where
    f_i = E/(k·T)·(tokens of the sequence routed to i) and P_i = mean over the sequence of expert i's
    normalised affinity; averaged over routers. About 1 when routing is uniform within every sequence."""
    total, n = None, 0
    for name, (x, ids) in tap.inputs.items():
        gate = tap.gates[name]
        n_experts, k = gate.weight.size(0), ids.size(-1)
        # the router's affinities for all experts (the gate itself returns only the chosen ones)
        scores = F.softplus(F.linear(x.float(), gate.weight.float()) / gate.temp).sqrt()    # [N, E]
        scores = scores.view(batch, -1, n_experts)                                          # [B, T, E]
        probs = scores / (scores.sum(-1, keepdim=True) + 1e-20)
        T = scores.size(1)
        counts = F.one_hot(ids.view(batch, T * k), n_experts).sum(1).float()                # [B, E]
        f = counts * n_experts / (k * T)
        loss = (f * probs.mean(1)).sum(-1).mean()
        total, n = (loss if total is None else total + loss), n + 1
    if total is None:
        raise InputError("sequence_balance_loss: no router inputs were recorded (RouterTap(keep_inputs=True))")
    return total / n
