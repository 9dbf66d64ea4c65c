"""The official checkpoint format: `engine quantize` writes it, the lazy reader checks and loads it bit for bit,
the quantized model computes what the dequantized one does, generation and the app accept it, and every kind
of broken checkpoint gets an error naming the tensor and the shard."""
from __future__ import annotations

import copy
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.official import OfficialCheckpoint, ShardRows
from engine.checkpoint.official_layout import INDEX_NAME, official_args, official_folder, shard_name
from engine.checkpoint.official_load import load_official, load_official_model
from engine.checkpoint.official_writer import encode, write_official
from engine.checkpoint.store import CheckpointError, config_beside, load_checkpoint
from engine.cli import main
from engine.generation import Engine
from engine.quant.formats import dequantize_fp8
from engine.quant.host_engram import HostEngramTable
from engine.request import GenerationRequest
from engine.spec.config import load_config
from engine.spec.errors import InputError

pytestmark = pytest.mark.slow  # writes, reads and breaks tiny official-format checkpoints, generates from them [15 s]

SOURCE = Path(__file__).resolve().parents[2] / "checkpoints" / "default"
SHARDS = 3


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    """The shipped checkpoint converted by `python -m engine quantize` into three shards."""
    out = tmp_path_factory.mktemp("official") / "default-fp8"
    assert main(["quantize", "--checkpoint", str(SOURCE), "--out", str(out), "--shards", str(SHARDS)]) == 0
    return out


@pytest.fixture(scope="module")
def inventory(official):
    return {spec.name: spec for spec in inventory_tuple(load_config(official / "config.json"))}


@pytest.fixture(scope="module")
def token_map():
    return np.arange(load_config(SOURCE / "config.json").vocab_size) % 5000


@pytest.fixture(scope="module")
def quantized(official, token_map):
    """The official checkpoint loaded as the engine runs it: weights FP8 / FP4 in memory, Engram on the host."""
    return load_official_model(official, token_map=token_map)[1]


@pytest.fixture
def broken(official, tmp_path) -> Path:
    """A copy of the official checkpoint, for a test to damage."""
    return Path(shutil.copytree(official, tmp_path / "broken"))


def weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / INDEX_NAME).read_text())["weight_map"]


def rewrite_shard(folder: Path, holding: str, change) -> str:
    """Rewrite the shard that holds tensor `holding` with change(tensors) applied; returns the shard's name."""
    shard = weight_map(folder)[holding]
    tensors = load_file(folder / shard)
    change(tensors)
    save_file(tensors, folder / shard)
    return shard


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


# ---- the writer ----------------------------------------------------------------------------------------------

def test_writer_lays_out_the_official_folder(official, inventory):
    args = load_config(official / "config.json")
    assert (args.dtype, args.expert_dtype) == ("fp8", "fp4")
    assert args.replace(dtype="bf16", expert_dtype="bf16") == load_config(SOURCE / "config.json")
    assert "quantization_config" in json.loads((official / "config.json").read_text())
    assert (official / "id_map.json").read_bytes() == (SOURCE / "id_map.json").read_bytes()
    shards = [shard_name(i, SHARDS) for i in range(SHARDS)]
    assert shards[0] == "model-00001-of-00003.safetensors"
    assert sorted(p.name for p in official.glob("*.safetensors")) == shards
    mapping = weight_map(official)
    assert set(mapping) == set(inventory) and set(mapping.values()) == set(shards)
    for name, spec in inventory.items():
        if spec.is_scale:  # each scale sits in its weight's shard
            assert mapping[name] == mapping[name.removesuffix(".scale") + ".weight"], name
    # every stored dtype and shape is the inventory's (the reader's own check, over all tensors)
    located = OfficialCheckpoint(official).locate(list(inventory), inventory)
    assert {loc.spec.dtype for loc in located.values()} == {"F8_E4M3", "F8_E8M0", "I8", "BF16", "F32"}
    total = json.loads((official / INDEX_NAME).read_text())["metadata"]["total_size"]
    assert total == sum(spec.nbytes for spec in inventory.values())


def test_every_tensor_reads_back_bit_exactly(official, inventory):
    """Read back through the lazy reader, each tensor has the bytes of an independent encoding of the source."""
    source = load_file(SOURCE / "model.safetensors")
    args = load_config(official / "config.json")
    expected: dict[str, torch.Tensor] = {}
    for spec in inventory.values():
        if not spec.is_scale:
            expected.update(encode(spec, source[spec.name], args))
    ckpt = OfficialCheckpoint(official)
    located = ckpt.locate(list(inventory), inventory)
    seen = 0
    for name, tensor in ckpt.tensors(located, budget=1 << 20):  # a small budget: the mapping is reopened often
        assert tensor.dtype == expected[name].dtype and raw_bytes(tensor) == raw_bytes(expected[name]), name
        seen += 1
    assert seen == len(inventory)
    # BF16 / F32 tensors are the source's bits; a dequantized FP8 weight re-quantizes to the stored codes
    assert raw_bytes(expected["norm.weight"]) == raw_bytes(source["norm.weight"])
    w = "layers.2.attn.wq_b.weight"
    again = encode(inventory[w], dequantize_fp8(expected[w], expected[w[:-6] + "scale"]), args)
    assert raw_bytes(again[w]) == raw_bytes(expected[w])


def test_writer_refusals(official, tmp_path):
    with pytest.raises(CheckpointError, match="already in the official format"):
        write_official(official, tmp_path / "again")
    with pytest.raises(CheckpointError, match="--shards must be between 1 and"):
        write_official(SOURCE, tmp_path / "zero", shards=0)
    with pytest.raises(CheckpointError, match="already holds a checkpoint"):
        write_official(SOURCE, official)


# ---- loading ---------------------------------------------------------------------------------------------------

def test_quantized_model_holds_the_stored_tensors(official, quantized):
    model = quantized
    assert model.args == official_args(load_config(SOURCE / "config.json"))
    stored = {}
    for shard in official.glob("*.safetensors"):
        stored.update(load_file(shard))
    state = model.state_dict()
    quantized = [n for n, t in state.items() if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.int8)
                 and not t.is_meta]
    assert len(quantized) > 500
    for name in quantized:
        assert raw_bytes(state[name]) == raw_bytes(stored[name]), name
    wo_a = "layers.3.attn.wo_a"   # held dequantized (spec §2.4)
    assert torch.equal(state[f"{wo_a}.weight"], dequantize_fp8(stored[f"{wo_a}.weight"], stored[f"{wo_a}.scale"]))
    table = model.layers[1].engram.embed
    assert isinstance(table, HostEngramTable) and isinstance(table.weight_source, ShardRows)
    ids = torch.tensor([[5, 0, 5], [24561, 7, 5]])
    assert raw_bytes(table.weight_source.rows(ids)) == raw_bytes(stored["layers.1.engram.embed.weight"][ids])
    assert raw_bytes(table.scale_source.rows(ids)) == raw_bytes(stored["layers.1.engram.embed.scale"][ids])


def test_quantized_logits_equal_the_dequantized_model(official, quantized, token_map):
    """Both runs quantize activations to FP8 (the config's dtype asks for it); the quantized model dequantizes
    its FP8 / FP4 weights per use, the reference holds them dequantized. The dequantized values are exact in
    fp32, so in an fp32 model only the order of float sums could differ: agreement to 1e-5 of the logit range
    (bf16 accumulation would allow ~1e-2)."""
    _, dequantized = load_official_model(official, token_map=token_map, quantized=False)
    assert type(dequantized.layers[1].engram.embed) is torch.nn.Embedding
    tokens = torch.randint(3, quantized.args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = quantized(tokens, logits="all").logits, dequantized(tokens, logits="all").logits
    diff = (a - b).abs().max().item()
    print(f"max |quantized − dequantized| logit difference: {diff:.3g} (logit range {b.abs().max().item():.3g})")
    assert diff <= 1e-5 * b.abs().max().item()


def test_engine_and_cli_generate_from_the_official_folder(official, capsys):
    engine = Engine.load(checkpoint=official)
    assert engine.source == f"checkpoint {official}" and engine.args.dtype == "fp8"
    assert isinstance(engine.model.layers[4].engram.embed, HostEngramTable)
    out = engine.generate_text("The king", GenerationRequest.greedy(6))
    assert len(out.result.tokens[0]) == 6
    assert main(["generate", "--checkpoint", str(official), "--prompt", "The king", "--max-new-tokens", "6"]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout.rstrip("\n") == "The king" + out.texts[0] and "tokens/s" in stderr


def test_hf_composite_config_loads_the_same(official, tmp_path):
    folder = Path(shutil.copytree(official, tmp_path / "hf"))
    flat = json.loads((folder / "config.json").read_text())
    quant = flat.pop("quantization_config")
    for key in ("dtype", "expert_dtype", "weight_block_size", "scale_fmt"):
        flat.pop(key)
    composite = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
                 "quantization_config": quant, "text_config": flat}
    (folder / "config.json").write_text(json.dumps(composite))
    assert official_folder(folder) == folder and config_beside(folder) == folder / "config.json"
    assert load_config(folder / "config.json") == load_config(official / "config.json")


def test_shard_rows_read_rows_only_and_survive_copies(official):
    ckpt = OfficialCheckpoint(official)
    name = "layers.4.engram.embed.weight"
    spec = next(s for s in inventory_tuple(ckpt.config()) if s.name == name)
    rows = ckpt.row_source(ckpt.locate([name], {name: spec})[name])
    table = load_file(official / weight_map(official)[name])[name]
    ids = torch.tensor([[3, 3, 25585], [0, 9, 3]])
    assert rows.rows(ids).shape == (2, 3, 32) and raw_bytes(rows.rows(ids)) == raw_bytes(table[ids])
    assert rows.rows(torch.empty(0, dtype=torch.long)).shape == (0, 32)
    for twin in (copy.deepcopy(rows), pickle.loads(pickle.dumps(rows))):
        assert raw_bytes(twin.rows(ids)) == raw_bytes(table[ids])
    with pytest.raises(InputError, match="outside 'layers.4.engram.embed.weight'"):
        rows.rows(torch.tensor([25586]))


def test_the_app_offers_the_official_folder(official, tmp_path):
    from v41viz.ui.engine_session import model_choices
    shelf = tmp_path / "checkpoints"
    shelf.mkdir()
    (shelf / "default-fp8").symlink_to(official)
    choice = model_choices(shelf)["checkpoint:default-fp8"]
    assert choice.official and choice.label == "default-fp8 (official FP8/FP4 checkpoint)"
    assert choice.checkpoint == shelf / "default-fp8"


# ---- broken checkpoints: each error names the tensor and the shard ----------------------------------------------

def test_missing_shard(broken):
    shard = shard_name(1, SHARDS)
    held = sorted(n for n, s in weight_map(broken).items() if s == shard)
    (broken / shard).unlink()
    with pytest.raises(CheckpointError, match=f"shard {shard} is missing") as e:
        load_checkpoint(broken)
    assert any(f"'{n}'" in str(e.value) for n in held)


def test_tensor_the_index_does_not_map(broken):
    mapping = json.loads((broken / INDEX_NAME).read_text())
    del mapping["weight_map"]["layers.3.attn.wkv.weight"]
    (broken / INDEX_NAME).write_text(json.dumps(mapping))
    # the shard still holds it: the index and the shards disagree, which is named before anything is read
    with pytest.raises(CheckpointError, match=r"the shards disagree with model.safetensors.index.json: shard "
                                              r"model-\d+-of-\d+.safetensors holds 'layers.3.attn.wkv.weight', which "
                                              r"model.safetensors.index.json does not list"):
        load_checkpoint(broken)


def test_scale_missing_from_its_shard(broken):
    name = "layers.3.attn.wkv.scale"
    shard = rewrite_shard(broken, name, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=f"'{name}' \\(the E8M0 scale of 'layers.3.attn.wkv.weight'\\) is "
                                              f"missing from shard {shard}"):
        load_checkpoint(broken)


def test_scale_whose_shape_does_not_fit_its_weight(broken, quantized):
    name = "layers.0.attn.wq_a.scale"   # weight [128, 192] in [32, 32] blocks → scale [4, 6]
    shard = rewrite_shard(broken, name, lambda t: t.update({name: t[name][:, :5].contiguous()}))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(broken)
    assert (f"scale '{name}' in shard {shard} has shape [4, 5], but its weight 'layers.0.attn.wq_a.weight' "
            "[128, 192] (F8_E4M3) needs a scale of shape [4, 6]") in str(e.value)
    # nothing of a loaded model changes when a checkpoint does not fit
    before = {n: raw_bytes(t) for n, t in quantized.state_dict().items() if not t.is_meta}
    with pytest.raises(CheckpointError):
        load_official(quantized, broken)
    assert all(raw_bytes(t) == before[n] for n, t in quantized.state_dict().items() if not t.is_meta)


@pytest.mark.parametrize("name, change, message", [
    ("layers.0.ffn.shared_experts.w1.weight", lambda t: t.to(torch.bfloat16),
     "is stored as BF16; the official format stores it as F8_E4M3"),
    ("layers.2.ffn.experts.5.w2.weight", lambda t: torch.zeros(192, 96, dtype=torch.int8),
     "has shape [192, 96]; the config needs [192, 48]"),
    ("layers.2.attn_norm.weight", lambda t: t.float(), "is stored as F32; the official format stores it as BF16"),
])
def test_tensor_with_a_non_official_dtype_or_shape(broken, name, change, message):
    shard = rewrite_shard(broken, name, lambda t: t.update({name: change(t[name])}))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(broken)
    assert f"'{name}' in shard {shard} {message}" in str(e.value)


def test_cli_names_tensor_and_shard(broken, capsys):
    name = "layers.0.attn.wq_a.scale"
    shard = rewrite_shard(broken, name, lambda t: t.update({name: t[name].view(torch.uint8)}))
    assert main(["generate", "--checkpoint", str(broken), "--prompt", "x", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"'{name}' in shard {shard} is stored as U8" in err
