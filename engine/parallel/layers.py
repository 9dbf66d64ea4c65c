"""Tensor-parallel layers: column- and row-parallel linears (plain or FP8), the vocabulary-parallel embedding, head."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.linear import Linear
from ..model.transformer import Transformer
from ..quant.modules import FP8Linear, QuantizedLinear
from ..spec.errors import InputError
from ..speedups.fast_quant_linear import FastFP8Linear
from .comm import all_gather_cat, all_reduce_sum


def sliced(param: nn.Parameter, dim: int, part: slice) -> nn.Parameter:
    """A new parameter holding param's [part] along dim (a copy, so the full tensor can be freed)."""
    return nn.Parameter(param.detach().narrow(dim, part.start, part.stop - part.start).clone(),
                        requires_grad=param.requires_grad)


def slice_weight(linear: Linear, dim: int, part: slice, label: str) -> None:
    """Keep rows (dim 0) or columns (dim 1) [part] of `linear`'s weight. An FP8 weight keeps the rows or columns
    of its E8M0 scale that cover them: one scale per [b0, b1] block, so the part must fill whole blocks (its
    start on a block boundary, its end too or at the weight's edge), else each rank would need the blocks it
    shares with its neighbours."""
    if isinstance(linear, QuantizedLinear):
        if not isinstance(linear, FP8Linear):
            raise InputError(f"{label}: a {type(linear).__name__} weight is not split between ranks (only FP8 "
                             "linears are; routed experts go whole to one rank)")
        block, length = linear.block[dim], linear.weight.size(dim)
        if part.start % block or (part.stop % block and part.stop != length):
            what = "rows" if dim == 0 else "columns"
            raise InputError(f"{label}: this rank's {what} {part.start}..{part.stop} of the FP8 weight "
                             f"{list(linear.weight.shape)} do not fill whole {list(linear.block)} scale blocks; "
                             f"choose a number of ranks that splits its {length} {what} into multiples of {block}")
        linear.scale = sliced(linear.scale, dim, slice(part.start // block, -(-part.stop // block)))
    linear.weight = sliced(linear.weight, dim, part)


class ColumnParallelLinear(Linear):
    """A Linear that holds this rank's block of output rows: it computes this rank's slice of the features
    (its heads, its output groups) from the full input. No communication."""

    @classmethod
    def adopt(cls, linear: Linear, rows: slice, label: str = "linear") -> "ColumnParallelLinear":
        slice_weight(linear, 0, rows, label)
        linear.out_features = rows.stop - rows.start
        linear.__class__ = ColumnParallelFP8Linear if isinstance(linear, FP8Linear) else cls
        return linear

    def extra_repr(self) -> str:
        return super().extra_repr() + ", column-parallel"


class RowParallelLinear(Linear):
    """A Linear that holds this rank's block of input columns: it takes this rank's slice of the features, and
    one all-reduce sums the partial products of all ranks, so that every rank gets the full output."""
    group: object
    label: str

    @classmethod
    def adopt(cls, linear: Linear, cols: slice, group, label: str) -> "RowParallelLinear":
        if linear.act_quant and linear.quantized and (cols.stop - cols.start) % 32:
            raise InputError(f"{label}: {cols.stop - cols.start} input features per rank do not fill whole FP8 "
                             "activation blocks of 32, so the ranks would quantize differently from one process")
        slice_weight(linear, 1, cols, label)
        linear.in_features = cols.stop - cols.start
        linear.group, linear.label = group, label
        linear.__class__ = RowParallelFP8Linear if isinstance(linear, FP8Linear) else cls
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(super().forward(x), self.group, self.label)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", row-parallel (all-reduce)"


class ColumnParallelFP8Linear(ColumnParallelLinear, FastFP8Linear):
    """An FP8Linear over this rank's rows and their scale blocks: FP8Linear's forward (dequantized per call; a few
    CPU rows in the C++ kernel of FastFP8Linear, each output as one process computes it)."""


class RowParallelFP8Linear(RowParallelLinear, FastFP8Linear):
    """An FP8Linear over this rank's columns and their scale blocks; its partial products summed by one
    all-reduce (RowParallelLinear.forward around FP8Linear's)."""


class VocabParallelEmbedding(nn.Module):
    """Rows [first, first + n) of the token table. An id held elsewhere gives a zero row here; one all-reduce
    adds each id's row from the rank that holds it (an exact sum: every other term is zero)."""

    def __init__(self, embedding: nn.Embedding, rows: slice, group, label: str = "embed"):
        super().__init__()
        self.first, self.n_rows, self.group, self.label = rows.start, rows.stop - rows.start, group, label
        self.num_embeddings = embedding.num_embeddings
        self.weight = sliced(embedding.weight, 0, rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        held = (local >= 0) & (local < self.n_rows)
        rows = F.embedding(local.clamp(0, self.n_rows - 1), self.weight)       # [..., dim]
        return all_reduce_sum(rows.masked_fill(~held.unsqueeze(-1), 0), self.group, self.label)

    def extra_repr(self) -> str:
        return f"rows {self.first}..{self.first + self.n_rows - 1} of {self.num_embeddings}, vocabulary-parallel"


class VocabParallelTransformer(Transformer):
    """The Transformer whose head holds this rank's block of vocabulary rows: each rank computes the logits of
    its tokens and one all-gather puts the full [..., V] logits on every rank, so that every rank samples the
    same token from the same seeded generator. `world` (engine.parallel.World) and `layout` (Layout) say which."""

    def vocab_logits(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self.layout.vocab_sizes()                      # blocks one apart where V does not divide
        local = super().vocab_logits(x)                        # [..., this rank's block]
        padded = F.pad(local, (0, max(sizes) - local.size(-1)))  # all_gather takes equal shapes
        parts = all_gather_cat(padded, self.world.group, "head").split(max(sizes), -1)
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes)], -1)   # [..., V]
