"""configs/v4.1-flash-rehearsal.json is the release with only depth, expert count and Engram rows cut: every
per-token field equals configs/deepseek-v4.1-flash.json's, so the rehearsal cannot drift from the release, and
every kind of layer the release has is still there."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.official_layout import official_args
from engine.spec.config import ModelArgs, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REHEARSAL, RELEASE = CONFIGS / "v4.1-flash-rehearsal.json", CONFIGS / "deepseek-v4.1-flash.json"
MIB = 2 ** 20
# what the rehearsal may change: depth (and the layer ids that name layers), expert counts, Engram rows, and the
# runtime cap on one sequence's length (not a width: caches are sized per generation)
CUT = {"n_layers", "compress_ratios", "kv_source_layers", "index_source_layers", "candidate_source_layer",
       "engram_layer_ids", "engram_vocab_size", "engram_num_embeddings", "dspark_target_layer_ids",
       "n_routed_experts", "dspark_n_routed_experts", "max_seq_len", "name"}
CUT_KEYS = {"num_hidden_layers", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
            "candidate_source_layer_id", "engram_layer_ids", "engram_vocab_size", "engram_num_embeddings",
            "dspark_target_layer_ids", "n_routed_experts", "dspark_n_routed_experts"}


def test_every_per_token_field_is_the_releases():
    rehearsal, release = load_config(REHEARSAL), load_config(RELEASE)
    differ = {f.name for f in fields(ModelArgs) if getattr(rehearsal, f.name) != getattr(release, f.name)}
    assert differ <= CUT, f"per-token fields differ from the release: {sorted(differ - CUT)}"
    # the file itself: the release's JSON, key for key, with only the cut keys' values changed (+ max_seq_len)
    raw, want = json.loads(REHEARSAL.read_text()), json.loads(RELEASE.read_text())
    text, text_want = raw.pop("text_config"), want.pop("text_config")
    assert raw == want
    assert text.pop("max_seq_len") >= 65536
    assert text.keys() == text_want.keys()
    assert {k for k in text if text[k] != text_want[k]} <= CUT_KEYS
    # spot checks of the widths the issue names
    a = rehearsal
    assert (a.dim, a.n_heads, a.head_dim, a.rope_head_dim, a.q_lora_rank, a.o_groups, a.o_lora_rank) == \
        (5120, 64, 512, 64, 1280, 8, 1024)
    assert (a.index_n_heads, a.index_head_dim, a.index_topk, a.candidate_topk_blocks, a.candidate_block_size) == \
        (32, 128, 512, 2048, 8)
    assert (a.window_size, a.vocab_size, a.hc_mult, a.hc_sinkhorn_iters, a.moe_inter_dim) == (128, 129280, 4, 20, 2304)
    assert (a.n_activated_experts, a.n_shared_experts, a.engram_n_heads, a.engram_head_dim) == (6, 1, 8, 256)
    assert (a.dspark_block_size, a.dspark_markov_rank, a.dspark_n_activated_experts) == (5, 256, 3)
    assert len(a.dspark_target_layer_ids) * a.dim == len(release.dspark_target_layer_ids) * release.dim  # main_proj


def test_the_cuts_keep_every_kind_of_layer():
    a = load_config(REHEARSAL)
    roles = a.roles[: a.n_layers]
    kinds = {
        "ratio 0": [r for r in roles if r.ratio == 0],
        "ratio 2 KV source": [r for r in roles if r.ratio == 2 and r.kv_mode == "own"],
        "ratio 2 reader": [r for r in roles if r.ratio == 2 and r.kv_mode == "reuse"],
        "ratio 1 KV source": [r for r in roles if r.ratio == 1 and r.kv_mode == "own"],
        "candidate source": [r for r in roles if r.candidate_source],
        "Reindex (candidates)": [r for r in roles if r.indexer == "reindex" and r.uses_candidates],
        "index reuse": [r for r in roles if r.indexer == "reuse"],
        "Engram on a window layer": [r for r in roles if r.engram and r.ratio == 0],
        "Engram on a KV source": [r for r in roles if r.engram and r.kv_mode == "own"],
        "DSpark tap": [r for r in roles if r.tapped],
    }
    assert all(kinds.values()), [k for k, v in kinds.items() if not v]
    assert 8 <= a.n_routed_experts <= 16 and a.n_routed_experts >= a.n_activated_experts
    assert 8 <= a.dspark_n_routed_experts <= 16
    assert 1 <= a.n_draft_stages <= 3
    tables = sum(t.nbytes for t in inventory_tuple(official_args(a)) if ".engram.embed." in t.name)
    assert 100 * MIB <= tables <= 800 * MIB, f"Engram tables {tables / MIB:.0f} MiB"
