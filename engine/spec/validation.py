"""Consistency checks of ModelArgs: sizes, layer ids, KV/index sources, Engram rows, DSpark (torch-free)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import ModelArgs


def validate(a: "ModelArgs") -> None:
    """Raise ConfigError naming the first key whose value cannot describe a runnable model."""
    def need(cond: bool, key: str, problem: str) -> None:
        if not cond:
            raise ConfigError(f"'{key}' {problem}")

    for key in ("dim", "moe_inter_dim", "n_layers", "n_heads", "head_dim", "q_lora_rank", "o_lora_rank",
                "o_groups", "vocab_size", "window_size", "hc_mult", "n_routed_experts", "n_activated_experts"):
        need(getattr(a, key) > 0, key, f"must be positive, got {getattr(a, key)}")
    need(a.n_activated_experts <= a.n_routed_experts, "n_activated_experts",
         f"({a.n_activated_experts}) exceeds n_routed_experts ({a.n_routed_experts})")
    need(0 < a.rope_head_dim <= a.head_dim and a.rope_head_dim % 2 == 0, "rope_head_dim",
         f"must be even and within head_dim ({a.head_dim}), got {a.rope_head_dim}")
    need(a.n_heads % a.o_groups == 0, "o_groups", f"({a.o_groups}) must divide n_heads ({a.n_heads})")
    need(a.hc_sinkhorn_iters >= 1, "hc_sinkhorn_iters", "must be at least 1")
    need(a.score_func == "sqrtsoftplus", "score_func", f"must be 'sqrtsoftplus', got {a.score_func!r}")
    need(a.dtype in ("fp8", "bf16", "fp32"), "dtype", f"must be fp8, bf16 or fp32, got {a.dtype!r}")
    need(a.expert_dtype in ("", "fp4", "fp8", "bf16", "fp32"), "expert_dtype",
         f"must be fp4, fp8, bf16 or fp32, got {a.expert_dtype!r}")
    need(len(a.weight_block_size) == 2 and all(b > 0 for b in a.weight_block_size), "weight_block_size",
         f"must be two positive integers, got {list(a.weight_block_size)}")
    need(0 <= a.n_hash_layers <= a.n_layers, "n_hash_layers", f"must lie in 0..n_layers, got {a.n_hash_layers}")

    n_total = a.n_layers + a.n_draft_stages
    need(len(a.compress_ratios) == n_total, "compress_ratios",
         f"has {len(a.compress_ratios)} entries; expected n_layers ({a.n_layers}) + "
         f"draft stages ({a.n_draft_stages}) = {n_total}")
    need(all(r >= 0 for r in a.compress_ratios), "compress_ratios", "must not contain negative ratios")
    need(all(r == 0 for r in a.compress_ratios[a.n_layers:]), "compress_ratios",
         "must be 0 for every draft stage (entries after n_layers)")
    compressed = any(a.compress_ratios[: a.n_layers])
    if compressed:
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            need(getattr(a, key) > 0, key, f"must be positive when layers compress KV, got {getattr(a, key)}")
        need(a.rope_head_dim <= a.index_head_dim, "index_head_dim",
             f"({a.index_head_dim}) must hold the rope channels ({a.rope_head_dim})")

    def in_range(key: str, ids: tuple[int, ...], hi: int) -> None:
        bad = [i for i in ids if not 0 <= i < hi]
        need(not bad, key, f"has layer id(s) {bad} outside 0..{hi - 1}")
        need(list(ids) == sorted(set(ids)), key, f"must be strictly increasing, got {list(ids)}")

    in_range("kv_source_layers", a.kv_source_layers, a.n_layers)
    in_range("index_source_layers", a.index_source_layers, a.n_layers)
    in_range("engram_layer_ids", a.engram_layer_ids, a.n_layers)
    in_range("dspark_target_layer_ids", a.dspark_target_layer_ids, a.n_layers)
    if a.kv_source_layers:  # V4.1: shared compressed KV
        ratios = a.compress_ratios
        for s in a.kv_source_layers:
            need(ratios[s] > 0, "kv_source_layers", f"names layer {s}, whose compress ratio is 0")
        missing = [s for s in a.kv_source_layers if s not in a.index_source_layers]
        need(not missing, "index_source_layers", f"must include every KV source layer; missing {missing}")
        for layer in range(a.n_layers):
            if ratios[layer]:
                src = max((s for s in a.kv_source_layers if s <= layer), default=None)
                need(src is not None, "kv_source_layers",
                     f"leaves compressed layer {layer} without an earlier KV source")
                need(ratios[src] == ratios[layer], "compress_ratios",
                     f"layer {layer} has ratio {ratios[layer]} but its KV source {src} has ratio {ratios[src]}")
        for s in a.index_source_layers:
            need(ratios[s] > 0, "index_source_layers", f"names layer {s}, whose compress ratio is 0")
    if a.candidate_source_layer >= 0:
        need(a.candidate_source_layer in a.index_source_layers, "candidate_source_layer",
             f"({a.candidate_source_layer}) must be one of index_source_layers {list(a.index_source_layers)}")
        need(a.candidate_topk_blocks > 0 and a.candidate_block_size > 0, "candidate_topk_blocks",
             "and candidate_block_size must be positive when a candidate source is set")
    if a.has_engram:
        need(len(a.engram_num_embeddings) == len(a.engram_layer_ids), "engram_num_embeddings",
             f"has {len(a.engram_num_embeddings)} entries for {len(a.engram_layer_ids)} Engram layers")
        for key in ("engram_vocab_size", "engram_n_heads", "engram_head_dim", "engram_compressed_vocab_size"):
            need(getattr(a, key) > 0, key, f"must be positive when Engram layers exist, got {getattr(a, key)}")
        need(a.engram_max_ngram_size >= 2, "engram_max_ngram_size", f"must be at least 2, got {a.engram_max_ngram_size}")
        for layer, expected, sizes in zip(a.engram_layer_ids, a.engram_num_embeddings, a.engram_layout.table_sizes()):
            need(sum(sizes) == expected, "engram_num_embeddings",
                 f"gives {expected} rows for layer {layer}, but its hash primes sum to {sum(sizes)}")
    if a.has_dspark:
        need(len(a.dspark_target_layer_ids) > 0, "dspark_target_layer_ids", "must name the tapped layers")
        need(a.dspark_markov_rank > 0, "dspark_markov_rank", "must be positive when DSpark is present")
        need(0 <= a.dspark_noise_token_id < a.vocab_size, "dspark_noise_token_id",
             f"({a.dspark_noise_token_id}) must be a token id below vocab_size ({a.vocab_size})")
        need(a.draft_n_activated_experts <= a.draft_n_routed_experts, "dspark_n_activated_experts",
             f"({a.draft_n_activated_experts}) exceeds the drafter's routed experts ({a.draft_n_routed_experts})")
