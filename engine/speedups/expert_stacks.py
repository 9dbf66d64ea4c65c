"""ExpertStacks: the routed experts' weights stacked into [E, …] tensors, rebuilt only when a weight changed."""
from __future__ import annotations

import torch
from torch import nn


class ExpertStacks:
    """Cache of one MoE's stacked expert weights (the gathered path and the Triton kernels index them by
    expert id) and of their dense concatenation (the all-experts path of small models)."""

    def __init__(self):
        self._key = None
        self._stacks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._dense_key = None
        self._dense: tuple[torch.Tensor, torch.Tensor] | None = None

    def stacked(self, experts: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """W1 [E, inter, dim], W2 [E, dim, inter], W3 [E, inter, dim], rebuilt whenever any expert weight was
        replaced or modified in place (its storage or its version counter changed)."""
        params = [e.w1.weight for e in experts] + [e.w2.weight for e in experts] + [e.w3.weight for e in experts]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key != self._key:
            E = len(experts)
            with torch.no_grad():
                self._stacks = tuple(torch.stack(params[i * E:(i + 1) * E]) for i in range(3))
            self._key = key
        return self._stacks

    def dense(self, experts: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        """W13 [2·E·inter, dim] (all W1 rows, then all W3 rows) and W2 [dim, E·inter] (the W2s side by side)."""
        w1, w2, w3 = self.stacked(experts)
        if self._key != self._dense_key:  # the key changes exactly when the stacks were rebuilt
            E, inter, dim = w1.shape
            self._dense = (torch.cat([w1.reshape(E * inter, dim), w3.reshape(E * inter, dim)]),
                           w2.permute(1, 0, 2).reshape(dim, E * inter))     # [dim, E, inter] → [dim, E·inter]
            self._dense_key = self._key
        return self._dense
