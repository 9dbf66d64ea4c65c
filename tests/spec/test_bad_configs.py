"""The bad-config corpus: every malformed config is refused with a ConfigError naming the key and the problem, on
the engine API and the CLI, and the memory bombs are refused in seconds and a few hundred MB (issue 16)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from engine import cli
from engine.plan.memory_fit import available_memory, check_model_fits, lower_bound, resident_bytes
from engine.spec.config import ConfigError, config_from_text, load_config
from engine.spec.errors import InputError
from engine.spec.limits import CONFIG_MAX_BYTES
from engine.spec.presets import list_presets
from engine.spec.strict_json import read_capped
from tests.bounded import run_engine

TINY = "configs/tiny-v4.1.json"   # the reference (flat) form
V41 = "configs/deepseek-v4.1-flash.json"  # the HF composite form (text_config, rope_scaling, quantization_config)
# A bomb used to take minutes and GBs; refused, it takes ~3 s on an idle 2-core machine, nearly all of it importing
# torch (8-15 s when other work loads the machine).
BOMB_WALL_S = 30.0
BOMB_RSS_MIB = 500    # importing torch alone peaks near 300 MB
MEMORY_CAP_MIB = 3072


def tiny(**changes) -> str:
    with open(TINY) as f:
        config = json.load(f)
    config.update(changes)
    return json.dumps(config)


def hf(mutate) -> str:
    with open(V41) as f:
        config = json.load(f)
    mutate(config)
    return json.dumps(config)


def text_config(**changes):
    return lambda c: c["text_config"].update(changes)


def drop(key):
    return lambda c: c.pop(key)


RATIOS = json.loads(Path(TINY).read_text())["compress_ratios"]
TINY_V4 = "configs/tiny-v4.json"


def tiny_v4(**changes) -> str:
    config = json.loads(Path(TINY_V4).read_text())
    config.update(changes)
    return json.dumps(config)


def hf_v4(**rates) -> str:
    """tiny-v4 in transformers' own V4 form: layer types and their compress rates instead of compress_ratios."""
    config = json.loads(Path(TINY_V4).read_text())
    ratios = config.pop("compress_ratios")[: config["n_layers"]]
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    n_hash = config.pop("n_hash_layers")
    config = {k: v for k, v in config.items() if not k.startswith("dspark_")}   # the plain V4: one MTP layer
    config["num_nextn_predict_layers"] = config.pop("n_mtp_layers")
    config.update(num_hidden_layers=config.pop("n_layers"), layer_types=[kinds[r] for r in ratios],
                  mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (len(ratios) - n_hash),
                  compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, **rates})
    return json.dumps(config)

# (case id, config text or bytes, what the message must say)
CORPUS = [
    # ---- reading the text ----
    ("duplicate-key", tiny()[:-1] + ', "dim": 96}', "key 'dim' appears twice in the same object"),
    ("duplicate-nested-key", hf(lambda c: None).replace('"hidden_size": 5120,', '"hidden_size": 5120, '
                                                        '"hidden_size": 1,'), "key 'hidden_size' appears twice"),
    ("deep-nesting-200k", "[" * 200_000 + "]" * 200_000, "nest too deeply"),
    ("deep-nesting-40", '{"dim": ' + "[" * 40 + "]" * 40 + "}", "nest 41 levels deep; a config nests at most 32"),
    ("over-1MiB", "{" + " " * CONFIG_MAX_BYTES + "}", "larger than 1 MiB"),
    ("not-utf8", b'{"dim": "\xff\xfe"}', "not a text file (not UTF-8 at byte 9)"),
    ("truncated", tiny()[:200], "invalid JSON at line 1"),
    ("top-level-list", "[1, 2]", "top level must be a JSON object, got a list"),
    ("5000-digit-integer", tiny()[:-1] + ', "dim": ' + "7" * 5000 + "}", "an integer of 5,000 digits"),
    # ---- wrong types ----
    ("int-NaN", tiny(n_layers=float("nan")), "'n_layers' must be a finite integer, got NaN"),
    ("int-Infinity", tiny(dim=float("inf")), "'dim' must be a finite integer, got Infinity"),
    ("int-1e400", tiny().replace('"dim": 64', '"dim": 1e400'), "'dim' must be a finite integer, got Infinity"),
    ("int-beyond-int64", tiny(moe_inter_dim=2**70), "'moe_inter_dim' is 1.181e+21, beyond the 64-bit integer range"),
    ("int-below-int64", tiny(window_size=-(2**70)), "'window_size' is -1.181e+21, beyond the 64-bit integer range"),
    ("architectures-numbers", hf(lambda c: (c.pop("model_type"), c["text_config"].pop("model_type"),
                                            c.update(architectures=[1, 2]))),
     "'architectures' must be a list of class names, got [1, 2]"),
    ("architectures-string", hf(lambda c: (c.pop("model_type"), c["text_config"].pop("model_type"),
                                           c.update(architectures="DeepseekV41ForCausalLM"))),
     "'architectures' must be a list of class names"),
    ("list-for-number", tiny(dim=[64]), "'dim' must be an integer, got [64]"),
    ("string-for-number", tiny(n_heads="4"), "'n_heads' must be an integer, got \"4\""),
    ("fraction-for-integer", tiny(head_dim=32.5), "'head_dim' must be an integer, got 32.5"),
    ("bool-for-integer", tiny(n_layers=True), "'n_layers' must be an integer, got true"),
    ("string-in-int-list", tiny(compress_ratios=[0, "2"] + RATIOS[2:]), "'compress_ratios[1]' must be an integer"),
    ("object-for-list", tiny(compress_ratios={}), "'compress_ratios' must be a list of integers, got {}"),
    ("string-for-float", tiny(norm_eps="1e-6"), "'norm_eps' must be a number, got \"1e-6\""),
    ("list-for-object", hf(text_config(rope_scaling=[])),
     "'rope_scaling' in text_config must be an object, got a list"),
    ("long-string", tiny(model_type="v41" * 400), "'model_type' is a string of 1,200 characters"),
    ("hf-alias-type", hf(text_config(hidden_size=[5120])),
     "'dim' must be an integer, got [5120] (from 'hidden_size' in text_config)"),
    ("wrong-constant-type", hf(text_config(num_key_value_heads=True)),
     "'num_key_value_heads' in text_config is true; only 1 is supported"),
    ("no-text-config", hf(drop("text_config")),
     "missing required key(s): dim (hidden_size), moe_inter_dim (moe_intermediate_size)"),
    ("unknown-huge-key", tiny(**{"x" * 5000: 1}), "unknown key 'xxxxxxxxxx"),
    # ---- float domains ----
    ("norm_eps-NaN", tiny(norm_eps=float("nan")), "'norm_eps' must be a finite number, got NaN"),
    ("norm_eps-negative", tiny(norm_eps=-1e-6), "'norm_eps' must be above 0, got -1e-06"),
    ("norm_eps-zero", tiny(norm_eps=0), "'norm_eps' must be above 0"),
    ("rope_theta-zero", tiny(rope_theta=0), "'rope_theta' must be above 1, got 0"),
    ("rope_theta-negative", hf(text_config(rope_theta=-10000)), "'rope_theta' must be above 1, got -10000"),
    ("compress_rope_theta-inf", tiny(compress_rope_theta=float("inf")),
     "'compress_rope_theta' must be a finite number, got Infinity"),
    ("rope_factor-zero", hf(lambda c: c["text_config"]["rope_scaling"].update(factor=0)),
     "'rope_factor' must be at least 1, got 0 (from 'factor' in text_config.rope_scaling)"),
    ("route_scale-NaN", hf(text_config(routed_scaling_factor=float("nan"))), "'route_scale' must be a finite number"),
    ("hc_eps-minus-inf", tiny(hc_eps=float("-inf")), "'hc_eps' must be a finite number, got -Infinity"),
    ("hc_eps-negative", tiny(hc_eps=-1e-6), "'hc_eps' must be at least 0"),
    ("yarn-betas-inverted", tiny(beta_fast=1, beta_slow=32), "'beta_fast' (1) must exceed beta_slow (32)"),
    ("gate_temp-zero", tiny(gate_temp=0), "'gate_temp' must be above 0"),
    ("swiglu_limit-negative", tiny(swiglu_limit=-10), "'swiglu_limit' must be at least 0"),
    ("vision_max_wh_ratio-negative", hf(lambda c: c["vision_config"].update(max_wh_ratio=-1)),
     "'vision_max_wh_ratio' must be above 0"),
    # ---- integer domains and relations ----
    ("max_seq_len-zero", tiny(max_seq_len=0), "'max_seq_len' must be at least 1, got 0"),
    ("max_seq_len-negative", tiny(max_seq_len=-5), "'max_seq_len' must be at least 1, got -5"),
    ("max_batch_size-zero", tiny(max_batch_size=0), "'max_batch_size' must be at least 1, got 0"),
    ("n_shared_experts-negative", tiny(n_shared_experts=-1), "'n_shared_experts' must be at least 0, got -1"),
    ("dspark_block_size-negative", tiny(dspark_block_size=-1), "'dspark_block_size' must be at least 0, got -1"),
    ("bos-beyond-vocab", tiny(bos_token_id=200_000), "'bos_token_id' (200000) must be a token id below vocab_size"),
    ("eos-negative", tiny(eos_token_id=-1), "'eos_token_id' must be at least 0, got -1"),
    ("pad-at-vocab", tiny(pad_token_id=129280), "'pad_token_id' (129280) must be a token id below vocab_size (129280)"),
    ("engram_pad_id-1e9", tiny(engram_pad_id=10**9), "'engram_pad_id' is 1,000,000,000, above the limit of"),
    ("engram_pad_id-beyond-vocab", tiny(engram_pad_id=129280), "'engram_pad_id' (129280) must be a token id below"),
    ("candidate-layer-below-minus-1", tiny(candidate_source_layer=-5), "'candidate_source_layer' must be at least -1"),
    ("empty-dspark-taps", tiny(dspark_target_layer_ids=[]), "'dspark_target_layer_ids' must name the tapped layers"),
    ("many-bad-layer-ids", tiny(kv_source_layers=list(range(2, 1002))),
     "'kv_source_layers' has layer id(s) [10, 11, 12, 13, 14, 15, 16, 17, … (992 in all)] outside 0..9"),
    # ---- sizes beyond the limits (engine/spec/limits.py) ----
    ("sinkhorn-1e9", tiny(hc_sinkhorn_iters=10**9), "'hc_sinkhorn_iters' is 1,000,000,000, above the limit of 256"),
    ("sinkhorn-zero", tiny(hc_sinkhorn_iters=0), "'hc_sinkhorn_iters' must be at least 1"),
    ("experts-1e7", tiny(n_routed_experts=10**7), "'n_routed_experts' is 10,000,000, above the limit of 4,096"),
    ("experts-total", tiny(n_routed_experts=4096), "'n_routed_experts' gives 40,972 routed experts in all"),
    ("layers-1e5", tiny(n_layers=10**5), "'n_layers' is 100,000, above the limit of 256"),
    ("vocab-1e9", tiny(vocab_size=10**9), "'vocab_size' is 1,000,000,000, above the limit"),
    ("dim-1e6", hf(text_config(hidden_size=10**6)), "'dim' is 1,000,000, above the limit of 65,536"),
    ("engram-heads", tiny(engram_n_heads=1000), "'engram_n_heads' is 1,000, above the limit of 64"),
    ("engram-tables", tiny(engram_n_heads=64, engram_max_ngram_size=16),
     "'engram_n_heads' (64) with 2 Engram layers and max n-gram 16 gives 1,920 hash tables found in 30 prime searches"),
    ("engram-vocab", tiny(engram_vocab_size=10**12), "'engram_vocab_size' is 1,000,000,000,000, above the limit"),
    ("compress-ratio-huge", tiny(compress_ratios=[0, 0, 10**6] + RATIOS[3:]),
     "'compress_ratios' has entries [1000000] outside 0..1,024"),
    ("block-size-zero", tiny(weight_block_size=[0, 32]), "'weight_block_size' has entries [0] outside 1..4,096"),
    # ---- the family: V4.1-only keys in a V4 config, V4 attention rates the engine cannot run (issue 46) ----
    ("v4-with-kv-sources", tiny_v4(kv_source_layers=[2, 3]),
     "'model_type' is 'deepseek_v4', the V4 family, but the config sets V4.1-only key(s) kv_source_layers, which a "
     "V4 model would ignore"),
    ("v4-with-indexer-and-engram", tiny_v4(index_source_layers=[2], candidate_source_layer=2, engram_layer_ids=[1],
                                           engram_vocab_size=1000, engram_n_heads=2),
     "V4.1-only key(s) index_source_layers, candidate_source_layer, engram_layer_ids, engram_vocab_size, "
     "engram_n_heads, which"),
    ("hf-v4-csa-rate-8", hf_v4(compressed_sparse_attention=8),
     "'compress_rates' sets compressed_sparse_attention to 8; this engine runs CSA at ratio 4 only"),
    ("hf-v4-hca-rate-4", hf_v4(heavily_compressed_attention=4),
     "'compress_rates' sets heavily_compressed_attention to 4; this engine runs HCA at a positive ratio other than 4"),
    ("hf-v4-hca-rate-string", hf_v4(heavily_compressed_attention="128"),
     "'compress_rates' sets heavily_compressed_attention to 128; this engine runs HCA"),
]


@pytest.mark.parametrize("text, message", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_a_bad_config_is_refused_naming_the_problem(text, message):
    with pytest.raises(ConfigError) as e:
        config_from_text(text, source="bad.json")
    assert str(e.value).startswith("bad.json: ")
    assert message in str(e.value)


def test_the_v4_forms_of_the_family_cases_load_when_consistent():
    """The corpus's V4 cases are one change away from a config the engine runs: HCA at ratio 8 (as transformers
    allows, tests/model/test_hf_differential.py) loads, as HCA."""
    assert config_from_text(tiny_v4()).family == "v4"
    assert config_from_text(hf_v4()).compress_ratios == load_config(TINY_V4).compress_ratios[:8]
    short = config_from_text(hf_v4(heavily_compressed_attention=8))
    assert short.compress_ratios == (0, 0, 4, 8, 4, 8, 4, 0)
    assert [r.attn_kind for r in short.roles] == ["SWA", "SWA", "CSA", "HCA", "CSA", "HCA", "CSA", "SWA"]


def test_the_corpus_is_large_and_the_cases_distinct():
    assert len(CORPUS) >= 40
    assert len({c[0] for c in CORPUS}) == len({c[1] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("changes, message", [
    (dict(dim="64"), "'dim' must be of type int, got str '64'"),
    (dict(norm_eps=float("nan")), "'norm_eps' must be a finite number, got nan"),
    (dict(compress_ratios=[0] * 13), "'compress_ratios' must be of type tuple[int, ...], got list"),
    (dict(n_routed_experts=True), "'n_routed_experts' must be of type int, got bool"),
    (dict(rope_factor=0.5), "'rope_factor' must be at least 1, got 0.5"),
])
def test_python_callers_get_the_same_checks(changes, message):
    """ModelArgs(...) and args.replace(...) skip the JSON reader: validation still refuses, naming the key."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(TINY).replace(**changes)


def test_a_file_over_the_cap_is_refused_after_reading_only_the_cap(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    big.write_text("{" + " " * (3 * CONFIG_MAX_BYTES) + "}")
    read = []

    def spy(path, max_bytes=CONFIG_MAX_BYTES):
        data = read_capped(path, max_bytes)
        read.append(len(data))
        return data

    monkeypatch.setattr("engine.spec.config.read_capped", spy)
    with pytest.raises(ConfigError, match=r"big\.json: the text is larger than 1 MiB"):
        load_config(big)
    assert read == [CONFIG_MAX_BYTES + 1]



@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_an_endless_file_is_refused_after_the_cap():
    with pytest.raises(ConfigError, match=r"^/dev/zero: the text is larger than 1 MiB"):
        load_config("/dev/zero")


@pytest.mark.parametrize("case", ["duplicate-key", "norm_eps-NaN", "architectures-numbers", "deep-nesting-200k",
                                  "sinkhorn-1e9", "no-text-config"])
def test_the_cli_exits_2_with_the_message(case, tmp_path, capsys):
    _, text, message = next(c for c in CORPUS if c[0] == case)
    path = tmp_path / f"{case}.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert cli.main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and message in err and err.count("\n") == 1


# ---- memory bombs: a fresh process under an address-space cap -------------------------------------------------
# case -> (the config text, built on demand; what the message must say)
BOMBS = {
    "experts-1e7": (lambda: tiny(n_routed_experts=10**7), "'n_routed_experts' is 10,000,000, above the limit"),
    "layers-1e5": (lambda: tiny(n_layers=10**5, compress_ratios=[0] * (10**5 + 3)),
                   "'n_layers' is 100,000, above the limit"),
    "layers-1e6-5MB": (lambda: tiny(n_layers=10**6, compress_ratios=[128] * 10**6), "larger than 1 MiB"),
    "nesting-200k": (lambda: "[" * 200_000 + "]" * 200_000, "nest too deeply"),
    "sinkhorn-1e9": (lambda: tiny(hc_sinkhorn_iters=10**9), "'hc_sinkhorn_iters' is 1,000,000,000, above the limit"),
}


# five fresh `python -m engine` processes under a memory cap, each importing torch [3-15 s each]
@pytest.mark.slow
@pytest.mark.parametrize("case", list(BOMBS))
def test_a_memory_bomb_config_is_refused_fast_and_small(case, tmp_path):
    """`info` for the config bombs; the Sinkhorn one through `generate`, where it used to hang."""
    build, message = BOMBS[case]
    path = tmp_path / f"{case}.json"
    path.write_text(build())
    command = ("generate", "--config", str(path), "--random-init", "--prompt", "hi", "--max-new-tokens", "2") \
        if case == "sinkhorn-1e9" else ("info", str(path))
    out = run_engine(*command, timeout_s=60, memory_cap_mib=MEMORY_CAP_MIB)
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr and out.stderr.startswith("error: ")
    assert out.wall_s < BOMB_WALL_S and out.peak_rss_mib < BOMB_RSS_MIB, (out.wall_s, out.peak_rss_mib)


@pytest.mark.slow  # the same, once [~3 s]
def test_random_init_of_a_model_too_big_for_memory_is_refused_up_front():
    out = run_engine("generate", "--config", "deepseek-v4.1-flash", "--random-init", "--prompt", "hi",
                     timeout_s=60, memory_cap_mib=MEMORY_CAP_MIB)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "model 'deepseek-v4.1-flash' needs at least 2,813.0 GiB for its weights" in out.stderr
    assert "is available (the address-space limit (ulimit -v) left to this process)" in out.stderr
    assert out.wall_s < BOMB_WALL_S and out.peak_rss_mib < BOMB_RSS_MIB, (out.wall_s, out.peak_rss_mib)


def test_every_preset_stays_well_inside_the_limits():
    """The real configs pass with at least 2× headroom on every bounded size."""
    from engine.spec import limits
    for name, path in list_presets().items():
        a = load_config(path)
        for key, (_lo, hi) in limits.INT_RANGES.items():
            assert getattr(a, key) <= hi // 2, (name, key)
        for key, (_lo, hi, _) in limits.FLOAT_RANGES.items():
            assert getattr(a, key) is None or getattr(a, key) <= hi / 2, (name, key)
        total = a.n_layers * a.n_routed_experts + a.n_draft_stages * a.draft_n_routed_experts
        assert total <= limits.MAX_ROUTED_EXPERTS_TOTAL // 2, name
        searches = len(a.engram_layer_ids) * (a.engram_max_ngram_size - 1)
        assert searches * searches * a.engram_n_heads <= limits.MAX_ENGRAM_PRIME_STEPS // 2, name


# ---- the memory estimate behind the refusal ------------------------------------------------------------------
def _allocated_bytes(model) -> int:
    """Bytes of every parameter and buffer a built model holds (meta tensors count their would-be size)."""
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_the_random_init_estimate_is_what_the_model_allocates(dtype_name):
    import torch

    from engine.model import Transformer
    dtype = getattr(torch, dtype_name)
    args = load_config(TINY)
    model = Transformer(args, dtype=dtype, device="meta")
    estimate = resident_bytes(args, dtype.itemsize)
    assert abs(_allocated_bytes(model) - estimate) / estimate < 0.02, (_allocated_bytes(model), estimate)


def test_the_official_estimate_counts_quantized_weights_as_stored_and_no_engram_table():
    import torch

    from engine.checkpoint.official_layout import official_args
    from engine.model import Transformer
    from engine.quant.apply import quantize_model
    args = official_args(load_config(TINY))
    model = quantize_model(Transformer(args, dtype=torch.float32, device="meta"), from_values=False)
    host = [p for p, m in model.named_modules() if getattr(m, "host_resident", False)]
    assert host  # the Engram tables: RowSources on the shard files, not allocated
    held = sum(t.numel() * t.element_size() for n, t in model.state_dict().items()
               if not any(n.startswith(p + ".") for p in host))
    estimate = resident_bytes(args, 4, official=True)
    assert abs(held - estimate) / estimate < 0.05, (held, estimate)


def test_the_official_estimate_of_v41_flash_is_its_checkpoint_without_the_engram_tables():
    """In bf16 the resident weights are the checkpoint minus the 189 GiB of Engram tables (plus wo_a in BF16)."""
    from engine.accounting.accounting import account
    acc = account(load_config(V41))
    without_tables = acc.checkpoint_bytes - acc.bytes_by_kind["engram_tables"]
    assert 1.0 < resident_bytes(load_config(V41), 2, official=True) / without_tables < 1.02


def test_the_closed_form_lower_bound_never_exceeds_the_estimate():
    for name in ("tiny-v4.1", "tiny-v4", "default-small", "deepseek-v4.1-flash"):
        a = load_config(list_presets()[name])
        official = a.replace(dtype="fp8", expert_dtype="fp4")
        assert lower_bound(a, 4) <= resident_bytes(a, 4)
        assert lower_bound(a, 2) <= resident_bytes(a, 2)
        assert lower_bound(official, 4, True) <= resident_bytes(official, 4, True)


def test_the_refusal_names_model_estimate_and_what_is_available():
    args = load_config(TINY)
    need = resident_bytes(args, 4)
    assert check_model_fits(args, 4, available=(need, "a test budget")) == need
    with pytest.raises(InputError) as e:
        check_model_fits(args, 4, available=(need - 1, "a test budget"))
    assert "model 'tiny-v4.1' needs about 75.3 MiB for its weights (every parameter in 4 B), but only 75.3 MiB is " \
           "available (a test budget); refused before allocating" in str(e.value)
    have, source = available_memory()
    assert have > 0 and source


def test_an_official_checkpoint_too_big_for_memory_is_refused_before_reading_it(tmp_path):
    """A folder whose config.json is the released V4.1-Flash one: refused from the config alone (the shards
    are not even looked for), with the resident estimate of the quantized lazy loader (~292 GiB: no Engram)."""
    from engine.generation import Engine
    (tmp_path / "config.json").write_text(open(V41).read())
    with pytest.raises(InputError, match=r"needs (at least|about) 2\d\d\.\d GiB for its weights \(FP8/FP4 weights "
                                         r"as stored, Engram tables left in the shard files\)"):
        Engine.load(checkpoint=tmp_path)
