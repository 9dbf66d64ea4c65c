"""Head-parallel attention: a rank's heads and output groups, and the trace's head means taken over all ranks."""
from __future__ import annotations

import torch

from ..model.attention import Attention
from ..model.context import ForwardContext
from ..model.draft import DraftAttention
from .comm import all_reduce_sum
from .layers import ColumnParallelLinear, RowParallelLinear, sliced


def shard_attention(attn: Attention, heads: slice, groups: slice, group, label: str) -> None:
    """Keep heads [heads] and output groups [groups] of `attn` (a target or drafter attention), in place.

    Split: wq_b (column-parallel: each rank's heads' queries), attn_sink (per head), wo_a (its groups' rows:
    groups hold consecutive heads, so a rank's groups read exactly its heads) and wo_b (row-parallel over the
    groups' low-rank outputs: the block's one all-reduce). Replicated, computed alike on every rank: wq_a and
    q_norm (the low-rank query every head reads), wkv and kv_norm (the single K=V head all heads share: it
    cannot be split by heads), the compressor (one latent per KV source) and the indexer (its own small heads;
    every rank must pick the same compressed rows, and its scores summed over ranks would cost an all-reduce
    of [B, S, rows] per layer). So every cache (window ring, compressed KV, index keys, pending groups) is the
    same on every rank: replicated, not split, and rolled back alike because every rank takes the same steps.
    In a quantized model wq_b and wo_b are FP8Linears: each keeps the scale blocks of its part
    (engine.parallel.layers.slice_weight); wo_a is dequantized at load, a plain Linear."""
    head_dim, o_rank = attn.head_dim, attn.o_rank
    ColumnParallelLinear.adopt(attn.wq_b, slice(heads.start * head_dim, heads.stop * head_dim), f"{label}.wq_b")
    attn.attn_sink = sliced(attn.attn_sink, 0, heads)
    ColumnParallelLinear.adopt(attn.wo_a, slice(groups.start * o_rank, groups.stop * o_rank), f"{label}.wo_a")
    RowParallelLinear.adopt(attn.wo_b, slice(groups.start * o_rank, groups.stop * o_rank), group,
                            f"{label}.wo_b")
    attn.heads_total = attn.n_heads
    attn.n_heads, attn.groups = heads.stop - heads.start, groups.stop - groups.start
    if not isinstance(attn, DraftAttention):  # the drafter's attention records nothing in the trace
        attn.__class__ = HeadParallelAttention   # (a speed-path class too: the parallel forward is the reference's)


class HeadParallelAttention(Attention):
    """Attention over this rank's heads. Its forward is the reference's; only the attention facts it records
    (window / compressed / sink mass, means over heads) are turned into means over all heads first."""
    heads_total: int

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        trace = ctx.trace
        if trace is None or not trace.wants_attention(f"{self.role.path}.attn"):
            return super().forward(x, ctx)
        ctx.trace = AllHeadsTrace(trace, self.n_heads / self.heads_total, self.wo_b.group,
                                  f"{self.role.path}.attn trace")
        try:
            return super().forward(x, ctx)
        finally:
            ctx.trace = trace


class AllHeadsTrace:
    """Stands in for the Trace inside one attention forward: the masses recorded as means over this rank's heads
    are weighted by its share of the heads and summed over the ranks (one all-reduce), then recorded."""

    def __init__(self, trace, share: float, group, label: str):
        self.trace, self.share, self.group, self.label = trace, share, group, label

    def wants_attention(self, path: str) -> bool:
        return self.trace.wants_attention(path)

    def record_attention(self, path, rows, positions, topk, window_mass, compressed_mass, sink_mass) -> None:
        masses = torch.stack([window_mass, compressed_mass, sink_mass]) * self.share   # [3, B, S]
        window_mass, compressed_mass, sink_mass = all_reduce_sum(masses.contiguous(), self.group, self.label)
        self.trace.record_attention(path, rows, positions, topk, window_mass, compressed_mass, sink_mass)
