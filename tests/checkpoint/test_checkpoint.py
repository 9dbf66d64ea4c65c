"""Checkpoints: safetensors save/load round trip (bit-exact logits), sharded layout, and every error case."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint.official_layout import INDEX_NAME
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.store import CheckpointError, load_checkpoint, load_weights, save_checkpoint
from engine.model import Transformer, init_weights
from engine.spec.config import load_config
from engine.spec.presets import list_presets
from engine.speedups import prepare_for_inference


@pytest.fixture(scope="module")
def tiny():
    args = load_config(list_presets()["tiny-v4.1"])
    token_map = np.arange(args.vocab_size) % args.engram_compressed_vocab_size
    model = prepare_for_inference(Transformer(args, token_map))   # as load_checkpoint prepares its model
    init_weights(model, seed=3)
    return args, token_map, model.eval()


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    _, _, model = tiny
    return save_checkpoint(model, tmp_path_factory.mktemp("ckpt"), {"note": "test"})


def logits_of(model, tokens=((0, 17, 999, 5, 1234, 77, 9),)):
    with torch.inference_mode():
        return model(torch.tensor(tokens), model.new_cache(len(tokens)), logits="all").logits


def fresh(tiny):
    args, token_map, _ = tiny
    model = prepare_for_inference(Transformer(args, token_map))   # as load_checkpoint prepares its model
    init_weights(model, seed=11)
    return model.eval()


def test_round_trip_gives_bit_identical_logits(tiny, saved):
    args, token_map, model = tiny
    assert saved.name == "model.safetensors" and (saved.parent / "config.json").is_file()
    args2, loaded = load_checkpoint(saved.parent, token_map=token_map)
    assert args2 == args
    assert torch.equal(logits_of(loaded), logits_of(model))
    # the weights really came from the file: a fresh model differs
    assert not torch.equal(logits_of(fresh(tiny)), logits_of(model))


def test_a_text_only_model_leaves_an_older_checkpoints_bias_vl_unread(tiny, saved, tmp_path):
    """Checkpoints written before the routers followed the config's vision setting (the shipped default among
    them) hold a zero `gate.bias_vl` per V4.1 router; a model without a vision tower has no image tokens to route
    with it, so it loads them as before, and `engine quantize` writes the text-only official layout."""
    args, token_map, model = tiny
    tensors = load_file(str(saved))
    assert not args.vision_enabled and not any(n.endswith("bias_vl") for n in tensors)
    tensors.update({f"{role.path}.ffn.gate.bias_vl": torch.zeros(args.n_routed_experts if role.layer < args.n_layers
                                                                 else args.draft_n_routed_experts)
                    for role in args.roles})
    older = tmp_path / "older"
    older.mkdir()
    save_file(tensors, str(older / "model.safetensors"), metadata={"format": "pt"})
    (older / "config.json").write_text((saved.parent / "config.json").read_text())
    _, loaded = load_checkpoint(older, token_map=token_map)
    assert torch.equal(logits_of(loaded), logits_of(model))
    written = write_official(older, tmp_path / "official", shards=1)
    assert not any(n.endswith("bias_vl") for n in json.loads((written.folder / INDEX_NAME).read_text())["weight_map"])
    tensors["layers.0.ffn.gate.bogus"] = torch.zeros(2)       # anything else stays refused
    save_file(tensors, str(older / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unexpected 1 tensor\(s\): 'layers\.0\.ffn\.gate\.bogus'"):
        load_checkpoint(older, token_map=token_map)


def test_bf16_storage_keeps_the_official_fp32_tensors(tiny, tmp_path):
    _, _, model = tiny
    file = save_checkpoint(model, tmp_path / "w.safetensors", dtype="bf16")
    stored = load_file(str(file))
    assert stored["layers.0.attn.wq_a.weight"].dtype == torch.bfloat16
    for name in ("layers.0.hc_attn_fn", "layers.0.attn.attn_sink", "layers.0.ffn.gate.bias"):
        assert stored[name].dtype == torch.float32, name
    m = fresh(tiny)
    load_weights(m, file)
    state, ref = m.state_dict(), model.state_dict()
    assert torch.equal(state["layers.0.attn.wq_a.weight"], ref["layers.0.attn.wq_a.weight"].bfloat16().float())
    assert torch.equal(state["layers.0.hc_attn_fn"], ref["layers.0.hc_attn_fn"])


def test_sharded_index_directory_loads(tiny, saved, tmp_path):
    _, _, model = tiny
    tensors = load_file(str(saved))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    m = fresh(tiny)
    load_weights(m, tmp_path)
    assert torch.equal(logits_of(m), logits_of(model))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard file"):
        load_weights(fresh(tiny), tmp_path)


def tamper(saved, tmp_path, change) -> str:
    tensors = load_file(str(saved))
    change(tensors)
    out = tmp_path / "bad.safetensors"
    save_file(tensors, str(out))
    return str(out)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("layers.3.ffn.gate.weight"), r"missing 1 tensor\(s\): 'layers.3.ffn.gate.weight'"),
    (lambda t: t.update({"layers.3.ffn.extra": torch.zeros(2)}), r"unexpected 1 tensor\(s\): 'layers.3.ffn.extra'"),
    (lambda t: t.update({"norm.weight": torch.zeros(7)}), r"'norm.weight' has shape \[7\], the model expects \[64\]"),
    (lambda t: t.update({"norm.weight": torch.zeros(64, dtype=torch.int32)}),
     r"'norm.weight' is stored as int32, the model expects float32"),
])
def test_mismatched_tensors_are_named_and_nothing_is_loaded(tiny, saved, tmp_path, change, message):
    m = fresh(tiny)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(CheckpointError, match=message):
        load_weights(m, tamper(saved, tmp_path, change))
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_official_quantized_scales_get_a_hint(tiny, saved, tmp_path):
    bad = tamper(saved, tmp_path, lambda t: t.update({"layers.0.attn.wq_a.scale": torch.ones(1, 2)}))
    with pytest.raises(CheckpointError, match="scale' tensors of the official format"):
        load_weights(fresh(tiny), bad)


def test_corrupt_and_missing_files(tiny, saved, tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_weights(fresh(tiny), garbage)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_weights(fresh(tiny), truncated)
    with pytest.raises(FileNotFoundError):
        load_weights(fresh(tiny), tmp_path / "nope.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="neither model.safetensors"):
        load_weights(fresh(tiny), tmp_path / "empty")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(garbage)
