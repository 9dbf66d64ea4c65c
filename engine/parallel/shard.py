"""Tensor/expert-parallel layout of a V4.1 model on N ranks, and the transform of a built model into a rank's shard."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..checkpoint.official_layout import scale_name, weight_name
from ..checkpoint.tensor_source import Source
from ..model.block import Block
from ..model.moe import MoE
from ..model.transformer import Transformer
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..spec.parallel_degree import check_parallel_degree
from ..speedups.fast_head import FastTransformer
from .attention import shard_attention
from .experts import expert_parallel
from .layers import VocabParallelEmbedding, VocabParallelTransformer, sliced
from .world import World

EXPERT = re.compile(r"^((?:layers|mtp)\.\d+\.ffn\.experts\.)(\d+)(\..+)$")


@dataclass(frozen=True)
class Layout:
    """What rank `rank` of `size` holds, from the config alone: one contiguous block of the attention heads and of
    the output groups, of the routed experts (target and drafter), and of the vocabulary. Everything else
    (router, shared expert, mHC, Engram, norms, compressor, indexer, the single KV head, the drafter's Markov
    and confidence heads and main_proj) is replicated: small, or needed whole by every rank. The Markov head's
    two [V, markov_rank] tables stay whole too: 2·V·256 values, against V·dim for each of embed and head."""
    args: ModelArgs
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise InputError(f"rank {self.rank} lies outside a world of {self.size} ranks")
        check_parallel_degree(self.args, self.size)   # heads, groups and experts in equal blocks

    def block(self, total: int, rank: int | None = None) -> slice:
        """Rank `rank`'s (default: this rank's) block of `total`: equal blocks where `total` divides evenly (heads,
        groups, experts must), else blocks one apart in size (the vocabulary)."""
        r = self.rank if rank is None else rank
        return slice(r * total // self.size, (r + 1) * total // self.size)

    @property
    def heads(self) -> slice:
        return self.block(self.args.n_heads)

    @property
    def groups(self) -> slice:
        return self.block(self.args.o_groups)

    @property
    def vocab(self) -> slice:
        return self.block(self.args.vocab_size)

    def vocab_sizes(self) -> list[int]:
        """Vocabulary rows per rank, in rank order."""
        blocks = [self.block(self.args.vocab_size, r) for r in range(self.size)]
        return [b.stop - b.start for b in blocks]

    def experts(self, draft: bool) -> slice:
        return self.block(self.args.draft_n_routed_experts if draft else self.args.n_routed_experts)

    def source(self, name: str) -> Source:
        """The full tensor and the part of it that this rank's tensor `name` holds. The E8M0 scale of a quantized
        weight (an official checkpoint's `X.scale`) holds the blocks of rows or columns that cover its weight's
        part (the parallel transforms refuse a part that does not fill whole blocks)."""
        a = self.args
        if name.endswith(".scale"):
            part = self.source(weight_name(name))
            return part.blocks(scale_name(part.name), a.weight_block_size[part.dim or 0])
        if name in ("embed.weight", "head.weight"):
            return Source(name, 0, self.vocab.start, self.vocab.stop)
        if name.endswith(".attn.wq_b.weight"):
            return Source(name, 0, self.heads.start * a.head_dim, self.heads.stop * a.head_dim)
        if name.endswith(".attn.attn_sink"):
            return Source(name, 0, self.heads.start, self.heads.stop)
        if name.endswith((".attn.wo_a.weight", ".attn.wo_b.weight")):
            dim = 0 if name.endswith("wo_a.weight") else 1
            return Source(name, dim, self.groups.start * a.o_lora_rank, self.groups.stop * a.o_lora_rank)
        expert = EXPERT.match(name)
        if expert:
            first = self.experts(name.startswith("mtp.")).start
            return Source(f"{expert[1]}{first + int(expert[2])}{expert[3]}")
        return Source(name)


def shard_model(model: Transformer, world: World) -> Transformer:
    """Turn `model` (the full model, built and filled alike on every rank, or built on the meta device) into this
    rank's shard, in place: its tensors become this rank's parts (Layout.source says which) and the split
    modules their parallel classes, which communicate inside forward. Returns `model`, with `world` and
    `layout` attached. The reference code of engine.model runs unchanged around them.

    The DSpark drafter's stages (mtp.*) are blocks and are split like the backbone's: in V4.1-Flash they hold
    3 × 128 routed experts (13.6G parameters, 6.8 GB in FP4), too much to copy to every GPU, and one transform
    keeps one code path. Every rank drafts from the same gathered logits with the same generators, so drafts,
    verification and the rollback of caches and drafter rings agree on every rank."""
    if world.size == 1:
        return model
    if type(model) not in (Transformer, FastTransformer):
        raise InputError(f"shard_model takes a reference Transformer, got {type(model).__name__}")
    layout = Layout(model.args, world.rank, world.size)
    blocks: list[Block] = [*model.layers, *model.mtp]
    for block in blocks:
        draft = block.path.startswith("mtp.")
        shard_attention(block.attn, layout.heads, layout.groups, world.group, f"{block.path}.attn")
        if isinstance(block.ffn, MoE):
            expert_parallel(block.ffn, layout.experts(draft), world.group, f"{block.path}.ffn")
    model.embed = VocabParallelEmbedding(model.embed, layout.vocab, world.group)
    model.head.weight = sliced(model.head.weight, 0, layout.vocab)
    model.head.out_features = layout.vocab.stop - layout.vocab.start
    model.__class__ = VocabParallelTransformer
    model.world, model.layout = world, layout
    return model

