"""Consistency checks of ModelArgs: types, limits, float domains, token ids, layer ids, KV/index sources,
Engram rows, DSpark (torch-free)."""
from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING

from .errors import ConfigError
from .limits import (
    ENTRY_RANGES,
    FLOAT_RANGES,
    INT_RANGES,
    MAX_ENGRAM_PRIME_STEPS,
    MAX_ROUTED_EXPERTS_TOTAL,
)

if TYPE_CHECKING:
    from .config import ModelArgs

# Fields only the V4.1 family reads (shared KV sources, the indexer's source layers and candidate filter, Engram):
# a V4 model ignores them, so a config that names V4 and sets one contradicts itself.
V41_ONLY = ("kv_source_layers", "index_source_layers", "candidate_source_layer", "candidate_topk_blocks",
            "candidate_block_size", "engram_layer_ids", "engram_vocab_size", "engram_num_embeddings",
            "engram_compressed_vocab_size", "engram_n_heads", "engram_head_dim")
WHY = "engine/spec/limits.py keeps every accepted config describable in bounded time and memory"


def validate(a: "ModelArgs") -> None:
    """Raise ConfigError naming the first key whose value cannot describe a runnable model. Types and ranges
    come first, so that no later check (or the Engram prime search) runs on an absurd size."""
    _check_types(a)
    _check_ranges(a)
    _check_floats(a)
    _check_sizes(a)
    _check_token_ids(a)
    if a.family == "v4":
        _check_v4_keys(a)
    _check_layers(a)
    _check_expert_total(a)
    if a.has_engram:
        _check_engram(a)
    if a.has_dspark:
        _check_dspark(a)


def need(cond: bool, key: str, problem: str) -> None:
    if not cond:
        raise ConfigError(f"'{key}' {problem}")


def few(ids) -> str:
    """A list for a message: the first 8 entries and how many more."""
    ids = list(ids)
    return str(ids) if len(ids) <= 8 else f"{str(ids[:8])[:-1]}, … ({len(ids)} in all)]"


def _check_types(a: "ModelArgs") -> None:
    """Python callers (ModelArgs(...), args.replace(...)) skip the JSON coercion: check the types here too."""
    for f in fields(a):
        v = getattr(a, f.name)
        if f.type == "int":
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif f.type in ("float", "float | None"):
            ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) or (v is None and f.type != "float")
        elif f.type == "tuple[int, ...]":
            ok = isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        else:
            ok = isinstance(v, {"str": str, "bool": bool}[f.type])
        need(ok, f.name, f"must be of type {f.type}, got {type(v).__name__} {str(v)[:40]!r}")


def _check_ranges(a: "ModelArgs") -> None:
    for key, (lo, hi) in INT_RANGES.items():
        v = getattr(a, key)
        need(v >= lo, key, f"must be at least {lo}, got {v}")
        need(v <= hi, key, f"is {v:,}, above the limit of {hi:,} ({WHY})")
    for key, (lo, hi) in ENTRY_RANGES.items():
        bad = [v for v in getattr(a, key) if not lo <= v <= hi]
        need(not bad, key, f"has entries {few(bad)} outside {lo}..{hi:,}")


def _check_floats(a: "ModelArgs") -> None:
    for key, (lo, hi, lo_ok) in FLOAT_RANGES.items():
        v = getattr(a, key)
        if v is None:
            continue
        need(math.isfinite(v), key, f"must be a finite number, got {v}")
        low = f"at least {lo:g}" if lo_ok else f"above {lo:g}"
        need(v >= lo if lo_ok else v > lo, key, f"must be {low}, got {v:g}")
        need(v <= hi, key, f"must be at most {hi:g}, got {v:g}")
    need(a.beta_fast > a.beta_slow, "beta_fast",
         f"({a.beta_fast:g}) must exceed beta_slow ({a.beta_slow:g}): YaRN ramps between them")


def _check_sizes(a: "ModelArgs") -> None:
    need(a.n_activated_experts <= a.n_routed_experts, "n_activated_experts",
         f"({a.n_activated_experts}) exceeds n_routed_experts ({a.n_routed_experts})")
    need(0 < a.rope_head_dim <= a.head_dim and a.rope_head_dim % 2 == 0, "rope_head_dim",
         f"must be even and within head_dim ({a.head_dim}), got {a.rope_head_dim}")
    need(a.n_heads % a.o_groups == 0, "o_groups", f"({a.o_groups}) must divide n_heads ({a.n_heads})")
    need(a.score_func == "sqrtsoftplus", "score_func", f"must be 'sqrtsoftplus', got {a.score_func!r}")
    need(a.dtype in ("fp8", "bf16", "fp32"), "dtype", f"must be fp8, bf16 or fp32, got {a.dtype!r}")
    need(a.expert_dtype in ("", "fp4", "fp8", "bf16", "fp32"), "expert_dtype",
         f"must be fp4, fp8, bf16 or fp32, got {a.expert_dtype!r}")
    need(len(a.weight_block_size) == 2, "weight_block_size",
         f"must be two positive integers, got {few(a.weight_block_size)}")
    need(a.n_hash_layers <= a.n_layers, "n_hash_layers", f"must lie in 0..n_layers, got {a.n_hash_layers}")


def _check_token_ids(a: "ModelArgs") -> None:
    """The ids the engine feeds the model; image_token_id is not among them (the vision tower is described, not run)."""
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "engram_pad_id"):
        v = getattr(a, key)
        need(v < a.vocab_size, key, f"({v}) must be a token id below vocab_size ({a.vocab_size})")


def _check_v4_keys(a: "ModelArgs") -> None:
    """A V4 config sets no V4.1-only key (a V4 model would silently run without it)."""
    defaults = {f.name: f.default for f in fields(a)}
    set_keys = [k for k in V41_ONLY if getattr(a, k) != defaults[k]]
    need(not set_keys, "model_type", f"is {a.model_type!r}, the V4 family, but the config sets V4.1-only key(s) "
         f"{', '.join(set_keys)}, which a V4 model would ignore: remove them, or set model_type to 'deepseek_v41'")


def _check_layers(a: "ModelArgs") -> None:
    def in_range(key: str, ids: tuple[int, ...], hi: int) -> None:
        bad = [i for i in ids if not 0 <= i < hi]
        need(not bad, key, f"has layer id(s) {few(bad)} outside 0..{hi - 1}")
        need(list(ids) == sorted(set(ids)), key, f"must be strictly increasing, got {few(ids)}")

    in_range("kv_source_layers", a.kv_source_layers, a.n_layers)
    in_range("index_source_layers", a.index_source_layers, a.n_layers)
    in_range("engram_layer_ids", a.engram_layer_ids, a.n_layers)
    in_range("dspark_target_layer_ids", a.dspark_target_layer_ids, a.n_layers)
    need(not a.has_dspark or len(a.dspark_target_layer_ids) > 0, "dspark_target_layer_ids",
         f"must name the tapped layers when dspark_block_size ({a.dspark_block_size}) turns DSpark on")
    need(not a.has_dspark or a.n_draft_stages > 0, "n_mtp_layers",
         f"(num_nextn_predict_layers) counts the DSpark stages and must be at least 1 when dspark_block_size "
         f"({a.dspark_block_size}) turns DSpark on, got {a.n_mtp_layers}")
    n_total = a.n_layers + a.n_draft_stages
    need(len(a.compress_ratios) == n_total, "compress_ratios",
         f"has {len(a.compress_ratios)} entries; expected n_layers ({a.n_layers}) + "
         f"draft stages ({a.n_draft_stages}) = {n_total}")
    need(all(r == 0 for r in a.compress_ratios[a.n_layers:]), "compress_ratios",
         "must be 0 for every draft stage (entries after n_layers)")
    if any(a.compress_ratios[: a.n_layers]):
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            need(getattr(a, key) > 0, key, f"must be positive when layers compress KV, got {getattr(a, key)}")
        need(a.rope_head_dim <= a.index_head_dim, "index_head_dim",
             f"({a.index_head_dim}) must hold the rope channels ({a.rope_head_dim})")
    if a.kv_source_layers:  # V4.1: shared compressed KV
        _check_kv_sources(a)
    if a.candidate_source_layer >= 0:
        need(a.candidate_source_layer in a.index_source_layers, "candidate_source_layer",
             f"({a.candidate_source_layer}) must be one of index_source_layers {few(a.index_source_layers)}")
        need(a.candidate_topk_blocks > 0 and a.candidate_block_size > 0, "candidate_topk_blocks",
             "and candidate_block_size must be positive when a candidate source is set")


def _check_expert_total(a: "ModelArgs") -> None:
    """Routed experts over all layers and draft stages: each is six tensors of the inventory."""
    backbone, draft = a.n_layers * a.n_routed_experts, a.n_draft_stages * a.draft_n_routed_experts
    key = "n_routed_experts" if backbone > MAX_ROUTED_EXPERTS_TOTAL else "dspark_n_routed_experts"
    need(backbone + draft <= MAX_ROUTED_EXPERTS_TOTAL, key,
         f"gives {backbone + draft:,} routed experts in all ({a.n_layers} layers × {a.n_routed_experts} + "
         f"{a.n_draft_stages} draft stages × {a.draft_n_routed_experts}), above the limit of "
         f"{MAX_ROUTED_EXPERTS_TOTAL:,} ({WHY})")


def _check_kv_sources(a: "ModelArgs") -> None:
    ratios = a.compress_ratios
    for s in a.kv_source_layers:
        need(ratios[s] > 0, "kv_source_layers", f"names layer {s}, whose compress ratio is 0")
    missing = [s for s in a.kv_source_layers if s not in a.index_source_layers]
    need(not missing, "index_source_layers", f"must include every KV source layer; missing {few(missing)}")
    for layer in range(a.n_layers):
        if ratios[layer]:
            src = max((s for s in a.kv_source_layers if s <= layer), default=None)
            need(src is not None, "kv_source_layers", f"leaves compressed layer {layer} without an earlier KV source")
            need(ratios[src] == ratios[layer], "compress_ratios",
                 f"layer {layer} has ratio {ratios[layer]} but its KV source {src} has ratio {ratios[src]}")
    for s in a.index_source_layers:
        need(ratios[s] > 0, "index_source_layers", f"names layer {s}, whose compress ratio is 0")


def _check_engram(a: "ModelArgs") -> None:
    need(len(a.engram_num_embeddings) == len(a.engram_layer_ids), "engram_num_embeddings",
         f"has {len(a.engram_num_embeddings)} entries for {len(a.engram_layer_ids)} Engram layers")
    for key in ("engram_vocab_size", "engram_n_heads", "engram_head_dim", "engram_compressed_vocab_size"):
        need(getattr(a, key) > 0, key, f"must be positive when Engram layers exist, got {getattr(a, key)}")
    need(a.engram_max_ngram_size >= 2, "engram_max_ngram_size",
         f"must be at least 2, got {a.engram_max_ngram_size}")
    searches = len(a.engram_layer_ids) * (a.engram_max_ngram_size - 1)
    tables = searches * a.engram_n_heads
    need(searches * tables <= MAX_ENGRAM_PRIME_STEPS, "engram_n_heads",
         f"({a.engram_n_heads}) with {len(a.engram_layer_ids)} Engram layers and max n-gram {a.engram_max_ngram_size} "
         f"gives {tables:,} hash tables found in {searches} prime searches ({searches * tables:,} search steps), "
         f"above the limit of {MAX_ENGRAM_PRIME_STEPS:,} ({WHY})")
    for layer, expected, sizes in zip(a.engram_layer_ids, a.engram_num_embeddings, a.engram_layout.table_sizes()):
        need(sum(sizes) == expected, "engram_num_embeddings",
             f"gives {expected} rows for layer {layer}, but its hash primes sum to {sum(sizes)}")


def _check_dspark(a: "ModelArgs") -> None:
    need(a.dspark_markov_rank > 0, "dspark_markov_rank", "must be positive when DSpark is present")
    need(0 <= a.dspark_noise_token_id < a.vocab_size, "dspark_noise_token_id",
         f"({a.dspark_noise_token_id}) must be a token id below vocab_size ({a.vocab_size})")
    need(a.draft_n_activated_experts <= a.draft_n_routed_experts, "dspark_n_activated_experts",
         f"({a.draft_n_activated_experts}) exceeds the drafter's routed experts ({a.draft_n_routed_experts})")
