"""Source: which stored tensor, and which of its rows or columns, a tensor of a model holds; read alone."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Source:
    """Where a tensor a model holds comes from in a checkpoint: the stored tensor `name` (the checkpoint's name),
    rows or columns [start, stop) along `dim` of it, or all of it (dim None). A model in one process holds every
    tensor whole; a rank of engine.parallel holds its heads', groups', experts' or vocabulary's part."""
    name: str
    dim: int | None = None
    start: int = 0
    stop: int = 0

    def read(self, f) -> torch.Tensor:
        """This part from an open safetensors file (safe_open): get_slice copies only the part's bytes out of the
        memory-mapped file, so a part never costs the whole tensor."""
        if self.dim is None:
            return f.get_tensor(self.name)
        rows = f.get_slice(self.name)
        return rows[self.start:self.stop] if self.dim == 0 else rows[:, self.start:self.stop]

    def whole_blocks(self, block: int, length: int) -> Source:
        """The part widened to whole blocks of `block` along its dim (at most the tensor's `length`): what a
        block-scaled weight must read to be dequantized, before the part is cut out of the result."""
        if self.dim is None:
            return self
        return Source(self.name, self.dim, self.start - self.start % block, min(-(-self.stop // block) * block, length))

    def blocks(self, name: str, block: int) -> Source:
        """The rows or columns of the block scale `name` that cover this part of its weight (blocks of `block`)."""
        if self.dim is None:
            return Source(name)
        return Source(name, self.dim, self.start // block, -(-self.stop // block))
