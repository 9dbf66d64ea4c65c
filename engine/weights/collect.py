"""One view's statistics as long-format rows (one number a row), with what it could not read and why, and what
reading cost: the form every view, the comparison and the export share."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..checkpoint.errors import CheckpointError
from .reader import WeightReader

# The columns of every statistics table: which view and diagram box (module path), the tensor it comes from, its
# layer (draft stages after the backbone, -1 outside the layers), what the index counts (expert, head, stream...)
# and which, the statistic's name and its value.
COLUMNS = ("view", "module", "tensor", "layer", "axis", "index", "stat", "value")


@dataclass
class ViewResult:
    view: str
    rows: list[dict] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)     # module → why its tensors are not here
    problems: dict[str, str] = field(default_factory=dict)   # tensor → why it was not used (NaN / Inf, unreadable)
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0
    tensors_read: int = 0
    seconds: float = 0.0
    cached: bool = False                                     # served from a cache file (expert norms)


class Collector:
    """Gathers one view's rows while it reads: `get` returns a tensor or None, recording a missing tensor under its
    module and a damaged one (a NaN, an unreadable shard) under its name, so that one bad tensor never hides the
    rest of the view and never turns into a NaN statistic."""

    def __init__(self, reader: WeightReader, view: str):
        self.reader, self.result = reader, ViewResult(view)

    def wanted(self, name: str) -> bool:
        """Whether the checkpoint should hold `name`: its index lists it (a partial folder included)."""
        return name in self.reader.weight_map or self.reader.has(name)

    def available(self, name: str, module: str) -> bool:
        """Whether `name` can be read (from the headers alone); if not, why is recorded under `module`."""
        reason = self.reader.absence(name)
        if reason is not None:
            self.result.absent.setdefault(module, reason)
        return reason is None

    def get(self, name: str, module: str, read: Callable[[WeightReader, str], torch.Tensor] | None = None):
        if not self.available(name, module):
            return None
        try:
            return (read or WeightReader.tensor)(self.reader, name)
        except CheckpointError as e:
            self.result.problems[name] = str(e)
            return None

    def add(self, module: str, tensor: str, layer: int, axis: str, index: int, stat: str, value: float) -> None:
        value = float(value)
        if not math.isfinite(value):   # finite inputs, overflowing statistic: said, never a silent NaN cell
            self.result.problems[tensor] = f"'{tensor}': its {stat} is {value} (overflow of finite weights)"
            return
        self.result.rows.append({"view": self.result.view, "module": module, "tensor": tensor, "layer": layer,
                                 "axis": axis, "index": index, "stat": stat, "value": value})

    def add_many(self, module: str, tensor: str, layer: int, axis: str, stat: str, values: torch.Tensor) -> None:
        for i, v in enumerate(values.reshape(-1).tolist()):
            self.add(module, tensor, layer, axis, i, stat, v)


def measured(reader: WeightReader, view: str, body: Callable[[Collector], None]) -> ViewResult:
    """Run one view's body and note what it cost: the bytes and tensors it read, its wall time."""
    before, reads_before, t0 = reader.bytes_read, reader.reads, time.perf_counter()
    c = Collector(reader, view)
    with torch.no_grad():
        body(c)
    c.result.bytes_read = reader.bytes_read - before
    c.result.tensors_read = reader.reads - reads_before
    c.result.seconds = time.perf_counter() - t0
    return c.result
