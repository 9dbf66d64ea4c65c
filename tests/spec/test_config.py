"""ModelArgs: both config forms, validation messages, the layer-role table."""
import dataclasses
import json
import subprocess
import sys

import pytest

from engine.spec.config import ConfigError, config_from_dict, config_from_text, load_config
from engine.spec.presets import list_presets

V41 = "configs/deepseek-v4.1-flash.json"
V41_FLAT = "configs/deepseek-v4.1-flash-inference.json"


def raw(path):
    with open(path) as f:
        return json.load(f)


def test_all_presets_load():
    names = set(list_presets())
    assert {"deepseek-v4.1-flash", "deepseek-v4.1-flash-inference", "deepseek-v4-flash",
            "deepseek-v4-flash-dspark", "tiny-v4.1", "tiny-v4"} <= names
    for path in list_presets().values():
        load_config(path)


def test_hf_and_flat_forms_describe_the_same_model():
    a, b = load_config(V41), load_config(V41_FLAT)
    assert a.replace(model_type="", max_position_embeddings=0) == b
    assert (a.dim, a.n_layers, a.n_draft_stages, a.weight_block_size) == (5120, 40, 3, (32, 32))
    assert (a.rope_factor, a.original_seq_len, a.norm_eps, a.engram_pad_id) == (16, 65536, 1e-20, 2)
    assert a.dtype == "fp8" and a.expert_dtype == "fp4" and a.vision_n_layers == 32


def test_v4_configs():
    v4, v4d = load_config("configs/deepseek-v4-flash.json"), load_config("configs/deepseek-v4-flash-dspark.json")
    assert v4.family == v4d.family == "v4"
    assert (v4.n_draft_stages, v4d.n_draft_stages) == (1, 3)
    assert v4.weight_block_size == (128, 128) and v4.n_hash_layers == 3 and not v4.has_dspark


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["text_config"].update(hiden_size=1),
     "unknown key 'hiden_size' in text_config (did you mean 'hidden_size'?)"),
    (lambda c: c["text_config"].update(hidden_size="5120"), "'dim' must be an integer, got \"5120\""),
    (lambda c: c["text_config"].update(name="wide"),
     "'name' in text_config is not a config key: a config's name is its file name"),
    (lambda c: c["text_config"].update(compress_ratios=[0] * 40),
     "'compress_ratios' has 40 entries; expected n_layers (40) + draft stages (3) = 43"),
    (lambda c: c["text_config"].update(kv_source_layer_ids=[2, 8, 14, 44]),
     "'kv_source_layers' has layer id(s) [44] outside 0..39"),
    (lambda c: c["text_config"].update(dspark_target_layer_ids=[37, 38, 40]),
     "'dspark_target_layer_ids' has layer id(s) [40]"),
    (lambda c: c["text_config"].update(engram_layer_ids=[1, 41]), "'engram_layer_ids' has layer id(s) [41]"),
    (lambda c: c["text_config"].update(o_groups=7), "'o_groups' (7) must divide n_heads (64)"),
    (lambda c: c["text_config"].update(engram_num_embeddings=[384006168, 5]),
     "'engram_num_embeddings' gives 5 rows for layer 14"),
    (lambda c: c["text_config"].update(hidden_act="gelu"), "'hidden_act' in text_config is 'gelu'"),
    (lambda c: c["text_config"].pop("hidden_size"), "missing required key(s): dim"),
    (lambda c: c["text_config"].update(kv_source_layer_ids=[2, 8, 14, 21], candidate_source_layer_id=-1,
                                        index_source_layer_ids=[2, 8, 14, 21]),
     "layer 20 has ratio 1 but its KV source 14 has ratio 2"),
    (lambda c: c["text_config"].update(candidate_source_layer_id=21), "'candidate_source_layer' (21) must be one of"),
    (lambda c: c.update(text_config=[]), "'text_config' must be an object"),
])
def test_validation_names_the_key(mutate, message):
    config = raw(V41)
    mutate(config)
    with pytest.raises(ConfigError) as e:
        config_from_dict(config)
    assert message in str(e.value)


def test_an_unknown_key_is_never_told_to_use_name():
    config = raw(V41)
    config["text_config"]["nam"] = "wide"   # closest to the field `name`, which a file cannot set
    with pytest.raises(ConfigError) as e:
        config_from_dict(config)
    assert "unknown key 'nam' in text_config" in str(e.value) and "name'?" not in str(e.value)


def test_bad_files(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"dim": 5,')
    with pytest.raises(ConfigError, match="broken.json: invalid JSON at line 1"):
        load_config(broken)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.json")
    binary = tmp_path / "weights.json"
    binary.write_bytes(b"\x80\x81\xff")
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(binary)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        load_config(tmp_path / "list.json")


def test_model_args_is_frozen_and_torch_free():
    a = load_config(V41)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.dim = 1
    code = "import sys, engine.spec.config, engine.spec.roles, engine.spec.engram_layout; " \
           "engine.spec.config.load_config('configs/deepseek-v4.1-flash.json').roles; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_v41_role_table_matches_spec():
    roles = load_config(V41).roles
    assert len(roles) == 43 and roles[40].path == "mtp.0" and roles[40].draft
    by = {r.layer: r for r in roles}
    assert by[0].kv_mode == "window" and by[0].rope_base == 10000 and not by[0].yarn
    assert by[1].engram and by[14].engram and not by[2].engram
    for src in (2, 8, 14, 20):
        assert by[src].kv_mode == "own" and by[src].indexer == "own"
    for layer in range(3, 8):
        assert (by[layer].kv_source, by[layer].indexer, by[layer].index_source) == (2, "reuse", 2)
    assert by[20].candidate_source and by[20].ratio == 1 and by[20].rope_base == 160000 and by[20].yarn
    for layer in (24, 28, 32, 36):
        r = by[layer]
        assert (r.indexer, r.kv_source, r.index_key_source, r.uses_candidates) == ("reindex", 20, 20, True)
    assert by[27].index_source == 24 and by[39].index_source == 36 and by[23].index_source == 20
    assert [r.layer for r in roles if r.tapped] == [37, 38, 39]
    assert [r.ratio for r in roles[40:]] == [0, 0, 0]


def test_tiny_presets_exercise_every_mechanism():
    t = load_config("configs/tiny-v4.1.json").roles
    assert {r.ratio for r in t} == {0, 1, 2}
    assert sum(r.kv_mode == "own" for r in t) >= 3 and any(r.kv_mode == "reuse" for r in t)
    assert any(r.indexer == "reindex" and r.uses_candidates for r in t)
    assert sum(r.engram for r in t) == 2 and sum(r.draft for r in t) == 3 and sum(r.tapped for r in t) == 3
    v4 = load_config("configs/tiny-v4.json")
    assert any(r.hash_routed for r in v4.roles) and {r.attn_kind for r in v4.roles} >= {"CSA", "HCA", "SWA"}


def test_engram_layout_matches_spec():
    a = load_config(V41)
    sizes = a.engram_layout.table_sizes()
    assert sizes[0][:8] == [16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183]
    assert sizes[1][16:] == [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889]
    assert [sum(s) for s in sizes] == [384006168, 384016682]
    assert a.engram_layout.offsets()[0][:3] == [0, 16000057, 32000136]
    assert a.engram_layout.offsets()[0][-1] == 368005705 and a.engram_layout.offsets()[1][-1] == 368015793
    assert a.engram_layout.multipliers() == [
        [76632096046245, 4839876093313, 35959672319349, 73987337458391],
        [67716810739261, 51510806800915, 30921347202721, 82619226485591]]


def test_config_text_and_bytes_load_like_the_file():
    """config_from_text is the one entry for text (the app's upload uses it): str or UTF-8 bytes, a BOM allowed."""
    text = open(V41_FLAT, encoding="utf-8").read()
    expected = load_config(V41_FLAT)
    assert config_from_text(text, name="deepseek-v4.1-flash-inference") == expected
    assert config_from_text(b"\xef\xbb\xbf" + text.encode(), name="x") == expected
    with pytest.raises(ConfigError, match=r"^upload\.json: invalid JSON at line 1"):
        config_from_text(b"{", source="upload.json")


def test_hf_null_rope_scaling_means_no_scaling():
    config = raw(V41)
    config["text_config"]["rope_scaling"] = None
    a = config_from_dict(config)
    assert (a.rope_factor, a.original_seq_len) == (1.0, 0)


def test_every_numeric_field_has_a_stated_limit():
    """engine/spec/limits.py bounds every integer and float field, so that no new field goes unchecked."""
    from dataclasses import fields

    from engine.spec.config import ModelArgs
    from engine.spec.limits import ENTRY_RANGES, FLOAT_RANGES, INT_RANGES
    by_type = {}
    for f in fields(ModelArgs):
        by_type.setdefault(f.type, set()).add(f.name)
    assert by_type["int"] == set(INT_RANGES)
    assert by_type["float"] | by_type["float | None"] == set(FLOAT_RANGES)
    assert set(ENTRY_RANGES) <= by_type["tuple[int, ...]"]


def test_a_wrong_value_is_reported_under_the_key_the_file_uses():
    config = raw(V41)
    config["text_config"]["rms_norm_eps"] = -1
    with pytest.raises(ConfigError, match=r"'norm_eps' must be above 0, got -1 \(from 'rms_norm_eps' in text_config\)"):
        config_from_dict(config)
