"""Every tensor of the official checkpoint, by name, shape and storage dtype, from ModelArgs alone (no torch).

Sources for names and shapes:
* V4.1: spec §2.3 (REF `inference/model.py` module definitions, checkpoint header audit, fixtures).
* V4 / V4-DSpark: the public V4 reference `inference/model.py` (classes Compressor, Indexer, Gate,
  MTPBlock, Transformer; read through vendored copies) and checkpoint fixtures
  (`layers.2.attn.compressor.ape F32 [4, 1024]`, `layers.0.ffn.gate.tid2eid I64 [129280, 6]`,
  1575 tensors under `mtp.0.*` in V4-Flash). The V4-DSpark drafter's names come from serving ports that load
  that checkpoint (a vLLM DSpark loader's "checkpoint layout (verified)", a quantizer's V4 MTP key list): three
  V4 blocks `mtp.{0,1,2}`, stage 0's main_proj / main_norm, and on the last stage norm, `hc_head_*`,
  `markov_head.markov_w1` / `markov_w2` (both [vocab, rank]) and `confidence_head.proj` — see DRAFT_NOTE.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, prod
from typing import TYPE_CHECKING

from ..spec.errors import InputError
from ..spec.roles import family_roles

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

# Bytes per stored element. I8 holds two FP4 (e2m1) values for routed experts.
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I32": 4, "I64": 8}
FP4_BLOCK = 32  # MXFP4: one E8M0 scale per 32 weights along the input dimension

DRAFT_NOTE = ("V4-DSpark drafter tensor names are inferred from serving ports that load that checkpoint, not from "
              "a published reference (V4.1 drafter layout, the V4 hc_head on the last stage, "
              "markov_head.markov_w1/markov_w2); its expert count falls back to n_routed_experts when "
              "dspark_n_routed_experts is absent.")
VISION_NOTE = ("vision: only tensors whose names and shapes the spec documents are listed (aligner, image_* "
               "vectors, per-block wqkv and mlp.w1); the released checkpoint has 266 vision/aligner/image_* "
               "tensors whose full list is not published.")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str          # safetensors dtype string
    params: int         # logical parameters (an FP4 [out, in/2] weight counts out·in; scales count 0)

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def is_scale(self) -> bool:
        return self.name.endswith(".scale") and self.dtype == "F8_E8M0"


class _Builder:
    """Collects TensorSpecs; the helpers encode the storage rules of args.dtype / expert_dtype."""

    def __init__(self, a: "ModelArgs"):
        self.a = a
        self.out: list[TensorSpec] = []
        self.float_dtype = "F32" if a.dtype == "fp32" else "BF16"   # what the release stores as BF16

    def raw(self, name: str, shape: tuple[int, ...], dtype: str, params: int | None = None) -> None:
        self.out.append(TensorSpec(name, tuple(shape), dtype, prod(shape) if params is None else params))

    def plain(self, name: str, *shape: int) -> None:
        """A tensor the release stores in BF16 (norms, embeddings, bf16 linears)."""
        self.raw(name, shape, self.float_dtype)

    def f32(self, name: str, *shape: int) -> None:
        """A tensor the release keeps in F32 (mHC params, attention sinks, gate biases, ape)."""
        self.raw(name, shape, "F32")

    def dense(self, prefix: str, out: int, inp: int, fmt: str | None = None) -> None:
        """A linear [out, in]: FP8 + per-block E8M0 scale under fp8, else a plain float weight."""
        fmt = fmt or self.a.dtype
        if fmt == "fp8":
            b0, b1 = self.a.weight_block_size
            self.raw(f"{prefix}.weight", (out, inp), "F8_E4M3")
            self.raw(f"{prefix}.scale", (ceil(out / b0), ceil(inp / b1)), "F8_E8M0", 0)
        elif fmt == "fp4":
            if inp % 2:
                raise InputError(f"{prefix}: FP4 storage packs two values per byte and needs an even input "
                                 f"width, got {inp}")
            # two e2m1 values per byte along the input dimension; one scale per 32 inputs
            self.raw(f"{prefix}.weight", (out, inp // 2), "I8", out * inp)
            self.raw(f"{prefix}.scale", (out, ceil(inp / FP4_BLOCK)), "F8_E8M0", 0)
        else:
            self.raw(f"{prefix}.weight", (out, inp), "F32" if fmt == "fp32" else "BF16")

    # ---- building blocks shared by backbone layers and draft stages ------------------------
    def mhc(self, p: str) -> None:
        a = self.a
        for site in ("attn", "ffn"):
            self.f32(f"{p}.hc_{site}_fn", a.hc_mix_dim, a.hc_dim)
            self.f32(f"{p}.hc_{site}_base", a.hc_mix_dim)
            self.f32(f"{p}.hc_{site}_scale", 3)

    def hc_head(self, p: str) -> None:
        a = self.a
        self.f32(f"{p}hc_head_fn", a.hc_mult, a.hc_dim)
        self.f32(f"{p}hc_head_base", a.hc_mult)
        self.f32(f"{p}hc_head_scale", 1)

    def attention_core(self, p: str) -> None:
        a = self.a
        self.f32(f"{p}.attn.attn_sink", a.n_heads)
        self.dense(f"{p}.attn.wq_a", a.q_lora_rank, a.dim)
        self.plain(f"{p}.attn.q_norm.weight", a.q_lora_rank)
        self.dense(f"{p}.attn.wq_b", a.n_heads * a.head_dim, a.q_lora_rank)
        self.dense(f"{p}.attn.wkv", a.head_dim, a.dim)
        self.plain(f"{p}.attn.kv_norm.weight", a.head_dim)
        # wo_a: 8 groups, each [o_lora_rank, n_heads·head_dim/o_groups], stored stacked
        self.dense(f"{p}.attn.wo_a", a.o_groups * a.o_lora_rank, a.n_heads * a.head_dim // a.o_groups)
        self.dense(f"{p}.attn.wo_b", a.dim, a.o_groups * a.o_lora_rank)

    def moe(self, p: str, n_experts: int, hash_routed: bool, vision_bias: bool) -> None:
        a = self.a
        self.plain(f"{p}.ffn.gate.weight", n_experts, a.dim)
        if hash_routed:
            # V4 hash routing: token id -> expert ids; an integer table, not a learned weight
            self.raw(f"{p}.ffn.gate.tid2eid", (a.vocab_size, a.n_activated_experts), "I64", 0)
        else:
            self.f32(f"{p}.ffn.gate.bias", n_experts)
        if vision_bias:
            self.f32(f"{p}.ffn.gate.bias_vl", n_experts)
        fmt = a.expert_dtype or a.dtype
        for e in range(n_experts):
            self.dense(f"{p}.ffn.experts.{e}.w1", a.moe_inter_dim, a.dim, fmt)
            self.dense(f"{p}.ffn.experts.{e}.w2", a.dim, a.moe_inter_dim, fmt)
            self.dense(f"{p}.ffn.experts.{e}.w3", a.moe_inter_dim, a.dim, fmt)
        shared = a.n_shared_experts * a.moe_inter_dim
        if shared:
            self.dense(f"{p}.ffn.shared_experts.w1", shared, a.dim)
            self.dense(f"{p}.ffn.shared_experts.w2", a.dim, shared)
            self.dense(f"{p}.ffn.shared_experts.w3", shared, a.dim)

    def block(self, p: str, n_experts: int, hash_routed: bool) -> None:
        a = self.a
        self.plain(f"{p}.attn_norm.weight", a.dim)
        self.plain(f"{p}.ffn_norm.weight", a.dim)
        self.mhc(p)
        self.attention_core(p)
        self.moe(p, n_experts, hash_routed, vision_bias=family_roles(a).vision_bias)


def _v41_layer_extras(b: _Builder, layer: int, p: str) -> None:
    """Compressor / indexer / Engram tensors owned by a V4.1 backbone layer (spec §2.3)."""
    a, role = b.a, b.a.roles[layer]
    if role.kv_mode == "own":
        if role.ratio > 1:  # ratio-1 sources project one latent per token and need no gate
            b.plain(f"{p}.attn.compressor.wgate.weight", a.head_dim, a.dim)
        b.plain(f"{p}.attn.compressor.wkv.weight", a.head_dim, a.dim)
        b.plain(f"{p}.attn.compressor.norm.weight", a.head_dim)
        b.plain(f"{p}.attn.indexer.wk.weight", a.index_head_dim, a.head_dim)
        b.plain(f"{p}.attn.indexer.k_norm.weight", a.index_head_dim)
    if role.indexer in ("own", "reindex"):
        b.dense(f"{p}.attn.indexer.wq_b", a.index_n_heads * a.index_head_dim, a.q_lora_rank)
        b.plain(f"{p}.attn.indexer.weights_proj.weight", a.index_n_heads, a.dim)
    if role.engram:
        rows = a.engram_num_embeddings[a.engram_layer_ids.index(layer)]
        _engram_table(b, f"{p}.engram.embed", rows)
        # one key per stream plus one shared value, from the concatenated hashed rows
        b.dense(f"{p}.engram.wkv", (a.hc_mult + 1) * a.dim, a.engram_n_columns * a.engram_head_dim)
        b.plain(f"{p}.engram.q_weight", a.hc_mult, a.dim)
        b.plain(f"{p}.engram.k_weight", a.hc_mult, a.dim)


def _engram_table(b: _Builder, p: str, rows: int) -> None:
    a = b.a
    if a.dtype == "fp8":  # FP8 rows with one E8M0 scale per 32 channels (spec §2.2)
        b.raw(f"{p}.weight", (rows, a.engram_head_dim), "F8_E4M3")
        b.raw(f"{p}.scale", (rows, ceil(a.engram_head_dim / 32)), "F8_E8M0", 0)
    else:
        b.plain(f"{p}.weight", rows, a.engram_head_dim)


def _v4_compressor(b: _Builder, p: str, ratio: int, head_dim: int) -> None:
    """V4 Compressor: ratio-4 (overlapping) compressors carry two windows, hence double width."""
    width = (2 if ratio == 4 else 1) * head_dim
    b.f32(f"{p}.ape", ratio, width)
    b.plain(f"{p}.wkv.weight", width, b.a.dim)
    b.plain(f"{p}.wgate.weight", width, b.a.dim)
    b.plain(f"{p}.norm.weight", head_dim)


def _v4_layer_extras(b: _Builder, layer: int, p: str) -> None:
    a = b.a
    ratio = a.compress_ratios[layer]
    if ratio:
        _v4_compressor(b, f"{p}.attn.compressor", ratio, a.head_dim)
    if ratio == 4:
        b.dense(f"{p}.attn.indexer.wq_b", a.index_n_heads * a.index_head_dim, a.q_lora_rank)
        b.plain(f"{p}.attn.indexer.weights_proj.weight", a.index_n_heads, a.dim)
        _v4_compressor(b, f"{p}.attn.indexer.compressor", ratio, a.index_head_dim)


def _drafter(b: _Builder) -> None:
    a = b.a
    n_stages = a.n_draft_stages
    for s in range(n_stages):
        p = f"mtp.{s}"
        b.block(p, a.draft_n_routed_experts if a.has_dspark else a.n_routed_experts, hash_routed=False)
        if not a.has_dspark:  # V4 MTP: embedding and hidden projections, own norm and hc_head
            b.plain(f"{p}.enorm.weight", a.dim)
            b.plain(f"{p}.hnorm.weight", a.dim)
            b.dense(f"{p}.e_proj", a.dim, a.dim)
            b.dense(f"{p}.h_proj", a.dim, a.dim)
            b.plain(f"{p}.norm.weight", a.dim)
            b.hc_head(f"{p}.")
    if a.has_dspark and n_stages:
        b.dense("mtp.0.main_proj", a.dim, len(a.dspark_target_layer_ids) * a.dim)
        b.plain("mtp.0.main_norm.weight", a.dim)
        last = f"mtp.{n_stages - 1}"
        b.plain(f"{last}.norm.weight", a.dim)
        if a.family == "v4":
            b.hc_head(f"{last}.")
        w1, w2 = family_roles(a).markov_names   # V4.1 embed / head; the V4-DSpark files say markov_w1 / markov_w2
        b.plain(f"{last}.markov_head.{w1}.weight", a.vocab_size, a.dspark_markov_rank)
        b.plain(f"{last}.markov_head.{w2}.weight", a.vocab_size, a.dspark_markov_rank)
        b.plain(f"{last}.confidence_head.proj.weight", 1, a.dim + a.dspark_markov_rank)


def _vision(b: _Builder) -> None:
    """The documented part of the vision tower and aligner (spec §2.3, §9); see VISION_NOTE."""
    a = b.a
    if not a.vision_n_layers:
        return
    vd = a.vision_dim
    for n in range(a.vision_n_layers):
        b.raw(f"vision.blocks.{n}.attn.wqkv.weight", (3 * vd, vd), "BF16")
        b.raw(f"vision.blocks.{n}.mlp.w1.weight", (2 * a.vision_inter_dim, vd), "BF16")
    merged = vd * a.vision_downsample_ratio ** 2  # pixel-unshuffle ×3 stacks 9 patches
    b.raw("aligner.w1.weight", (a.dim, merged), "BF16")
    b.raw("aligner.w1.bias", (a.dim,), "BF16")
    b.raw("aligner.w2.weight", (a.dim, a.dim), "BF16")
    b.raw("aligner.w2.bias", (a.dim,), "BF16")
    for name in ("image_start", "image_end", "image_newline"):
        b.raw(name, (a.dim,), "BF16")


@lru_cache(maxsize=4)  # a V4.1 inventory is ~96k specs (~20 MB); keep only a few configs
def _full_inventory(a: "ModelArgs") -> tuple[tuple[TensorSpec, ...], int]:
    """All tensors, vision last, and how many come before the vision ones."""
    b = _Builder(a)
    b.plain("embed.weight", a.vocab_size, a.dim)
    for layer in range(a.n_layers):
        p = f"layers.{layer}"
        b.block(p, a.n_routed_experts, hash_routed=layer < a.n_hash_layers)
        (_v41_layer_extras if a.family == "v4.1" else _v4_layer_extras)(b, layer, p)
    b.plain("norm.weight", a.dim)
    b.plain("head.weight", a.vocab_size, a.dim)
    if a.family == "v4":
        b.hc_head("")
    _drafter(b)
    n_text = len(b.out)
    _vision(b)
    return tuple(b.out), n_text


def inventory_tuple(args: "ModelArgs", include_vision: bool = False) -> tuple[TensorSpec, ...]:
    """The cached inventory itself (no copy); callers must not rely on mutating it."""
    full, n_text = _full_inventory(args)
    return full if include_vision else full[:n_text]


def tensor_inventory(args: "ModelArgs", include_vision: bool = False) -> list[TensorSpec]:
    """All checkpoint tensors under their official bare names (cached per args)."""
    return list(inventory_tuple(args, include_vision))
