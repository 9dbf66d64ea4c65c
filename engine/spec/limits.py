"""Every limit a config must stay within, in one place, with why (torch-free; validation applies them).

The upper bounds are chosen so that any accepted config can at least be described — tensor inventory,
accounting, role table, diagram — in bounded time and memory, with headroom over the largest real configs
(configs/*.json: V4.1-Flash has 40 layers × 384 experts, `engine info` takes ~3 s and ~270 MB for it).
Whether the model also fits in memory to *run* is a separate check (engine/plan/memory_fit.py).
"""
from __future__ import annotations

# ---- config files ------------------------------------------------------------------------------
# Real config.json files are 1-4 KB; 1 MiB leaves 250× room and keeps parsing a hostile file instant.
CONFIG_MAX_BYTES = 1 << 20
# Real configs nest 3 levels (config → text_config → rope_scaling); deeper JSON is not a config, and a
# bounded depth keeps every recursive step (parsing, error messages) far from Python's recursion limit.
JSON_MAX_DEPTH = 32
# No config value has more than 16 digits; a 4300-digit integer would already stall int() in Python.
JSON_MAX_INT_DIGITS = 100
# String values (model_type, dtype, score_func, ...) are short names; a long one is not a name.
STR_MAX_CHARS = 100

MIB = 1 << 20
VOCAB_MAX = 1 << 22        # token ids and vocabularies: 32× V4.1's 129,280
WIDTH_MAX = 1 << 16        # hidden sizes and ranks: 12× V4.1's dim 5,120
LAYERS_MAX = 256           # backbone layers: 6× V4-Flash's 43; the diagram draws ~20 boxes per layer
POSITIONS_MAX = 1 << 24    # sequence lengths: 16× V4.1's 1,048,576 positions

# Integer fields: (lowest, highest) accepted value. Relations between fields (top-k within the expert count,
# token ids within the vocabulary, layer ids within n_layers, ...) are checked in engine/spec/validation.py.
INT_RANGES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, VOCAB_MAX),
    "dim": (1, WIDTH_MAX),
    "moe_inter_dim": (1, WIDTH_MAX),
    "n_layers": (1, LAYERS_MAX),
    "n_mtp_layers": (0, 16),                  # V4.1: 3
    "n_heads": (1, 1024),                     # V4.1: 64
    "head_dim": (1, 4096),                    # V4.1: 512
    "rope_head_dim": (1, 4096),
    "q_lora_rank": (1, WIDTH_MAX),
    "o_groups": (1, 1024),
    "o_lora_rank": (1, WIDTH_MAX),
    "n_routed_experts": (1, 4096),            # V4.1: 384 (see also MAX_ROUTED_EXPERTS_TOTAL)
    "n_shared_experts": (0, 64),              # V4.1: 1
    "n_activated_experts": (1, 4096),
    "n_hash_layers": (0, LAYERS_MAX),
    "window_size": (1, WIDTH_MAX),            # V4.1: 128
    "original_seq_len": (0, POSITIONS_MAX),
    "index_n_heads": (0, 1024),
    "index_head_dim": (0, 4096),
    "index_topk": (0, POSITIONS_MAX),
    "candidate_source_layer": (-1, LAYERS_MAX - 1),   # -1: no candidate source
    "candidate_topk_blocks": (0, POSITIONS_MAX),
    "candidate_block_size": (0, POSITIONS_MAX),
    "hc_mult": (1, 16),                       # V4.1: 4 residual streams; the mixes are hc_mult² matrices
    "hc_sinkhorn_iters": (1, 256),            # V4.1: 20; every mHC seam of every token runs them all
    "engram_vocab_size": (0, 1 << 32),        # V4.1: 16,000,000; each hash-table prime is searched above it
    "engram_max_ngram_size": (0, 16),         # V4.1: 4
    "engram_pad_id": (0, VOCAB_MAX),
    "engram_compressed_vocab_size": (0, 1 << 24),  # V4.1: 99,092
    "engram_n_heads": (0, 64),                # V4.1: 8
    "engram_head_dim": (0, 4096),             # V4.1: 256
    "dspark_block_size": (0, 64),             # V4.1: 5 drafted tokens per step; 0 = no DSpark
    "dspark_noise_token_id": (-1, VOCAB_MAX),
    "dspark_markov_rank": (0, WIDTH_MAX),
    "dspark_n_routed_experts": (0, 4096),     # 0 = the backbone's count
    "dspark_n_activated_experts": (0, 4096),
    "vision_n_layers": (0, LAYERS_MAX),       # V4.1: 32
    "vision_dim": (0, WIDTH_MAX),
    "vision_n_heads": (0, 1024),
    "vision_inter_dim": (0, WIDTH_MAX),
    "vision_patch_size": (0, 4096),
    "vision_downsample_ratio": (1, 16),       # V4.1: 3
    "vision_max_n_token": (0, POSITIONS_MAX),
    "vision_min_pixels": (0, 1 << 40),
    "image_token_id": (-1, VOCAB_MAX),        # -1: no image token
    "bos_token_id": (0, VOCAB_MAX),
    "eos_token_id": (0, VOCAB_MAX),
    "pad_token_id": (0, VOCAB_MAX),
    "max_seq_len": (1, POSITIONS_MAX),
    "max_batch_size": (1, 1024),
    "max_position_embeddings": (0, POSITIONS_MAX),
}
# Entries of the integer-list fields (layer-id lists are bounded by n_layers instead).
ENTRY_RANGES: dict[str, tuple[int, int]] = {
    "compress_ratios": (0, 1024),             # V4: 4 and 128
    "weight_block_size": (1, 4096),           # V4.1: 32, V4: 128
    "engram_num_embeddings": (0, 1 << 48),    # checked exactly against the hash primes when Engram is on
}

# Each routed expert is 3 weights + 3 scales in the tensor inventory, which `info`, the diagram and the
# memory plan walk: routed experts summed over backbone layers and draft stages (V4.1: 40×384 + 3×128 = 15,744;
# V4-Flash: 44×256 = 11,264). V4.1 with 768 experts per layer (31,104 in all) takes `info` ~4 s of CPU and
# ~300 MB (against ~3 s and ~270 MB for the real one).
MAX_ROUTED_EXPERTS_TOTAL = 32768
# Engram hash tables: each is a prime found by Miller-Rabin when the config is validated, in one search per
# (Engram layer, n-gram size) that restarts above engram_vocab_size and steps past every table found before it.
# The work grows as searches × tables = (layers × (max n-gram − 1))² × heads: V4.1 has 6 searches × 48 tables
# = 288; at this bound validation spends ~0.2-0.5 s on the primes.
MAX_ENGRAM_PRIME_STEPS = 16384

# Float fields: (lowest, highest, whether the lowest is allowed). Every float must also be finite.
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "norm_eps": (0.0, 1.0, False),            # V4.1: 1e-20; an epsilon above 1 would swamp what it guards
    "hc_eps": (0.0, 1.0, True),               # V4.1: 1e-6
    "route_scale": (0.0, 1e6, False),         # V4.1: 1.5
    "gate_temp": (0.0, 1e6, False),
    "swiglu_limit": (0.0, 1e6, True),         # 0 = no clamp
    "rope_theta": (1.0, 1e30, False),         # a rotary base must exceed 1 so that base^(-2i/d) falls
    "compress_rope_theta": (1.0, 1e30, False),
    "vision_rope_theta": (1.0, 1e30, False),
    "rope_factor": (1.0, 1e6, True),          # YaRN stretches the context by this factor (V4.1: 16); 1 = none
    "beta_fast": (0.0, 1e6, False),           # YaRN ramp bounds in rotations; beta_fast > beta_slow
    "beta_slow": (0.0, 1e6, False),
    "vision_max_wh_ratio": (0.0, 1e6, False),  # or null
}
