"""FusedExperts: every expert's [W1; W3] and W2ᵀ in two stacks, a slice refreshed when its expert's weights change."""
from __future__ import annotations

import operator

import torch
from torch import nn

from .cpu_bf16 import resident


def _weights(expert: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # the module dicts directly: this runs for the chosen experts on every decode call (nn.Module.__getattr__ is slow)
    m = expert._modules
    return m["w1"]._parameters["weight"], m["w3"]._parameters["weight"], m["w2"]._parameters["weight"]


class FusedExperts:
    """W13 [n, 2·inter, dim] (each expert's W1 rows, then its W3 rows) and W2ᵀ [n, inter, dim] for a list of n
    experts (a MoE's routed experts, then its shared one). Copies of the parameters, which stay the state dict:
    before use, the experts a call reads are checked — their weights' storage, version counter and identity —
    and a changed expert's slice is copied again, so a decode step checks k + 1 experts, not all of them. A new
    expert count, shape, dtype or device rebuilds both stacks. Small bf16 experts on the CPU are stacked in fp32
    (engine.speedups.cpu_bf16.resident): the caller rounds each product to `param_dtype`, as bf16 kernels would."""

    def __init__(self):
        self.w13: torch.Tensor | None = None
        self.w2t: torch.Tensor | None = None
        self.param_dtype: torch.dtype | None = None   # the experts' weights' dtype (the stacks' unless fp32 copies)
        self._sources: list[tuple[torch.Tensor, ...]] = []
        self._stamps: list[list[tuple[int, int]]] = []

    def stacks(self, experts: list[nn.Module], used: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The stacks, current for the experts in `used` (default: all of them)."""
        if self.w13 is not None and torch.compiler.is_compiling():
            return self.w13, self.w2t   # compiled code holds its weights as traced, like a captured CUDA graph
        first = _weights(experts[0])[0]
        if (self.w13 is None or len(experts) != self.w13.size(0) or self.param_dtype != first.dtype
                or self.w13.device != first.device or self.w13.shape[1:] != (2 * first.size(0), first.size(1))):
            self._build(experts)
        for e in (range(len(experts)) if used is None else used):
            sources = _weights(experts[e])
            stamps = [(t.data_ptr(), t._version) for t in sources]
            if stamps != self._stamps[e] or not all(map(operator.is_, self._sources[e], sources)):
                self._copy(e, sources)
        return self.w13, self.w2t

    def _build(self, experts: list[nn.Module]) -> None:
        w1, _, w2 = _weights(experts[0])
        self.param_dtype = w1.dtype
        dtype = torch.float32 if resident(w1) and resident(w2) else w1.dtype
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors: refreshed in place later
            self.w13 = torch.empty(len(experts), 2 * w1.size(0), w1.size(1), dtype=dtype, device=w1.device)
            self.w2t = torch.empty(len(experts), w2.size(1), w2.size(0), dtype=dtype, device=w2.device)
        self._sources, self._stamps = [()] * len(experts), [[]] * len(experts)
        for e, expert in enumerate(experts):
            self._copy(e, _weights(expert))

    def _copy(self, e: int, sources: tuple[torch.Tensor, ...]) -> None:
        w1, w3, w2 = sources
        inter = w1.size(0)
        with torch.inference_mode(False), torch.no_grad():
            self.w13[e, :inter].copy_(w1)
            self.w13[e, inter:].copy_(w3)
            self.w2t[e].copy_(w2.t())
        self._sources[e] = sources
        self._stamps[e] = [(t.data_ptr(), t._version) for t in sources]
