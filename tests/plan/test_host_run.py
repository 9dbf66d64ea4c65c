"""engine.plan.host_run: the memory plan's figure for a CPU run in float32, part by part."""
from __future__ import annotations

from pathlib import Path

from engine.checkpoint.official_layout import official_args
from engine.plan.host_run import host_run_bytes
from engine.plan.memory_fit import resident_bytes
from engine.plan.memory_plan import Hardware, host_tensor_sizes, working_terms
from engine.request.request import PREFILL_CHUNK
from engine.spec.config import load_config

REHEARSAL = Path(__file__).resolve().parents[2] / "configs" / "v4.1-flash-rehearsal.json"


def test_the_parts_are_the_loader_the_caches_and_the_plans_terms_in_float32():
    a = official_args(load_config(REHEARSAL))
    got = host_run_bytes(a, 4096)
    assert got["total"] == sum(v for k, v in got.items() if k != "total")
    assert got["weights"] == resident_bytes(a, 4, official=True)        # FP8 / FP4 as stored, other floats fp32
    assert got["staging"] == 2 * host_tensor_sizes(a)[1]
    terms = working_terms(a, Hardware(gpus=1, context=4096, prefill_chunk=4096, reserve_gib=0.0))
    bf16 = terms["residual streams"] + terms["attention"] + terms["expert intermediates"]
    head_copy = a.vocab_size * a.dim * 4                                  # a GPU's fp32 head copy: none on the CPU
    assert got["working"] == sum(terms.values()) + bf16 - head_copy      # the BF16 terms counted at 4 bytes
    # caches: ratio-2 and ratio-1 KV sources hold context/ratio rows of head_dim (and index keys) in fp32
    rows = [4096 // 2 + 1, 4096 + 1]
    ring = a.n_layers * a.window_size * a.head_dim
    assert got["caches"] == 4 * (ring + sum(r * (a.head_dim + a.index_head_dim) for r in rows)) + 4096 * 8
    longer = host_run_bytes(a, 16384)
    assert longer["weights"] == got["weights"]
    assert longer["working"] > got["working"] and longer["caches"] > got["caches"]


def test_a_long_prompt_is_planned_in_the_engines_prefill_chunks():
    a = official_args(load_config(REHEARSAL))
    assert Hardware.prefill_chunk == PREFILL_CHUNK                      # the plan sizes what the engine runs
    chunked, one_step = host_run_bytes(a, 16384), host_run_bytes(a, 16384, prefill_chunk=16384)
    per_chunk = working_terms(a, Hardware(gpus=1, context=16384, prefill_chunk=PREFILL_CHUNK, reserve_gib=0.0))
    whole = working_terms(a, Hardware(gpus=1, context=16384, prefill_chunk=16384, reserve_gib=0.0))
    assert per_chunk["residual streams"] * 4 == whole["residual streams"]   # activations: one chunk's, not 16k's
    assert chunked["working"] < one_step["working"] and chunked["caches"] == one_step["caches"]
