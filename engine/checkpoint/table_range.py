"""Integer tables a checkpoint stores must index what the model has: V4's hash-routing table `gate.tid2eid`
names, per token id, experts that must exist (an id out of range would index past the expert list)."""
from __future__ import annotations

import torch

from .errors import CheckpointError

TABLE_SUFFIX = ".gate.tid2eid"


def check_table_range(state: dict[str, torch.Tensor], name: str, stored: torch.Tensor, where: str) -> None:
    """CheckpointError naming the tensor, `where` it is, and the ids it holds, if `name` is a hash-routing table
    whose expert ids fall outside 0..n_experts−1 of the gate beside it (its `weight` rows in `state`). Any other
    tensor passes."""
    if not name.endswith(TABLE_SUFFIX) or stored.numel() == 0:
        return
    gate_weight = state.get(name.removesuffix("tid2eid") + "weight")
    if gate_weight is None:
        return
    n_experts = gate_weight.size(0)
    low, high = (int(v) for v in torch.aminmax(stored))
    if low < 0 or high >= n_experts:
        raise CheckpointError(f"{where}: tensor '{name}' names expert ids {low}..{high}, outside the "
                              f"0..{n_experts - 1} the model's gate has; the checkpoint is damaged or made for "
                              "another config")
