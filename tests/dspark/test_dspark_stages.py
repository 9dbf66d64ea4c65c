"""DSpark stage count apart from the tap count (spec §7): `num_nextn_predict_layers` stage blocks, each reading the
whole draft block, and one main_proj as wide as all tapped layers whatever the number of stages."""
import json

import pytest
import torch

from engine.accounting.inventory import inventory_tuple, tensor_inventory
from engine.checkpoint.official_load import load_official_model
from engine.checkpoint.store import save_checkpoint
from engine.cli import main
from engine.generation import DSparkConfig, generate, generate_speculative
from engine.graphs.safety import check_draft_capture_safe
from engine.model import Transformer
from engine.quant.apply import round_trip_weights
from engine.request import GenerationRequest
from engine.spec.config import ConfigError, config_from_dict, load_config
from tests.model_helpers import synthetic_token_map, tiny_args, tiny_model

V41 = "configs/deepseek-v4.1-flash.json"
V = 64   # small enough that random-init drafts are sometimes right, so both verification outcomes occur
PROMPTS = [[0, 5, 7, 9, 11], [0, 10, 20], [0, 3, 3, 3, 3, 3, 3, 3, 3, 3]]


def release_with(stages: int, ratios: int | None = None):
    """The released HF config with `num_nextn_predict_layers` = stages and the backbone's ratios + `ratios` zeros."""
    raw = json.loads(open(V41).read())
    text = raw["text_config"]
    text["num_nextn_predict_layers"] = stages
    text["compress_ratios"] = text["compress_ratios"][: text["num_hidden_layers"]] + [0] * (
        stages if ratios is None else ratios)
    return config_from_dict(raw)


def tiny_stages(stages: int, **changes):
    a = tiny_args()
    return dict(n_mtp_layers=stages, compress_ratios=a.compress_ratios[: a.n_layers + stages], **changes)


@pytest.mark.parametrize("stages, n_mtp", [(1, 805), (2, 1603), (3, 2401)])
def test_release_stages_follow_num_nextn_predict_layers_and_keep_main_proj(stages, n_mtp):
    """Per stage 798 mtp.* tensors (a block with 128 experts), plus 7 of the first and last stage: 2401 for the
    release (spec §2.1). main_proj takes all three taps (15360 wide) with 1, 2 or 3 stages."""
    a = release_with(stages)
    assert (a.n_draft_stages, a.n_mtp_layers, a.dspark_target_layer_ids) == (stages, stages, (37, 38, 39))
    inv = {s.name: s.shape for s in inventory_tuple(a) if s.name.startswith("mtp.")}
    assert len(inv) == n_mtp
    assert inv["mtp.0.main_proj.weight"] == (5120, 15360) and inv["mtp.0.main_proj.scale"] == (160, 480)
    last = f"mtp.{stages - 1}"
    assert inv[f"{last}.markov_head.head.weight"] == (129280, 256)
    assert inv[f"{last}.confidence_head.proj.weight"] == (1, 5376)
    assert f"mtp.{stages}.attn_norm.weight" not in inv and not any(".main_proj" in n for n in inv if n[4] != "0")
    assert [r.path for r in a.roles if r.draft] == [f"mtp.{s}" for s in range(stages)]


def test_stage_count_mismatches_are_refused_by_name():
    """The issue's example (1 stage, 3 taps) now builds; compress_ratios must list one zero per stage, and DSpark
    needs at least one stage. The predecessor's DSpark revision keeps one stage per tap (its config says 1)."""
    with pytest.raises(ConfigError, match=r"'compress_ratios' has 43 entries; expected n_layers \(40\) \+ draft "
                                          r"stages \(1\) = 41"):
        release_with(1, ratios=3)
    with pytest.raises(ConfigError, match=r"'n_mtp_layers' \(num_nextn_predict_layers\) counts the DSpark stages"):
        release_with(0)
    a = tiny_args()
    small = a.replace(n_layers=4, n_mtp_layers=1, compress_ratios=(0, 2, 1, 0, 0), kv_source_layers=(1, 2),
                      index_source_layers=(1, 2), candidate_source_layer=1, engram_layer_ids=(1,),
                      engram_num_embeddings=a.engram_num_embeddings[:1], dspark_target_layer_ids=(1, 2, 3))
    assert (small.n_draft_stages, len(small.compress_ratios)) == (1, 5)
    v4d = load_config("configs/deepseek-v4-flash-dspark.json")
    assert (v4d.n_mtp_layers, v4d.n_draft_stages) == (1, 3)


@pytest.mark.parametrize("stages", [1, 2])
def test_fewer_stages_than_taps_build_name_for_name(stages):
    """state_dict == inventory, name for name and shape for shape; main_proj reads every tap; the forward's taps
    are that wide; the last stage holds the heads."""
    m = tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1, **tiny_stages(stages))
    a = m.args
    state = {n: tuple(t.shape) for n, t in m.state_dict().items()}
    assert state == {s.name: s.shape for s in tensor_inventory(a)}
    assert len(m.mtp) == stages and len(a.dspark_target_layer_ids) == 3
    assert state["mtp.0.main_proj.weight"] == (a.dim, 3 * a.dim)
    assert hasattr(m.mtp[-1], "markov_head") and all(not hasattr(s, "markov_head") for s in m.mtp[:-1])
    with torch.no_grad():
        assert m(torch.tensor([PROMPTS[0]])).taps.shape == (1, len(PROMPTS[0]), 3 * a.dim)


# two speculative and one plain run, eager and static bodies [~3 s each]; the 2-stage one in the slow stage only
@pytest.mark.parametrize("stages", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_fewer_stages_draft_losslessly(stages):
    """Greedy DSpark text equals plain greedy text with the eager drafter and with the CUDA-graph bodies (run
    eagerly on the CPU), and the static draft body reads nothing back to the host."""
    m = tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1, **tiny_stages(stages))
    plain = generate(m, PROMPTS, GenerationRequest.of(16, seed=0))
    spec = generate_speculative(m, PROMPTS, GenerationRequest.of(16, seed=0, dspark=DSparkConfig("all")))
    assert spec.tokens == plain.tokens
    assert 0 < spec.metrics.accepted < spec.metrics.scheduled and spec.metrics.target_forwards < 16
    graphed = generate_speculative(m, PROMPTS, GenerationRequest.of(16, seed=0, cuda_graphs=True))
    assert graphed.tokens == plain.tokens and graphed.graphed_forwards == graphed.target_forwards > 0
    check_draft_capture_safe(m.args, batch=2)


@pytest.mark.slow  # writes a tiny official folder, loads it quantized and generates with and without DSpark [~4 s]
def test_one_stage_round_trips_through_the_official_layout(tmp_path):
    """engine quantize writes the 1-stage drafter (main_proj FP8 at the width of three taps, heads on mtp.0);
    loaded quantized, the tensors are the inventory's and DSpark greedy equals plain greedy."""
    source = tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1, **tiny_stages(1))
    save_checkpoint(source, tmp_path / "src")
    out = tmp_path / "official"
    assert main(["quantize", "--checkpoint", str(tmp_path / "src"), "--out", str(out)]) == 0
    token_map = synthetic_token_map(source.args)
    args, model = load_official_model(out, token_map=token_map)
    assert (args.n_draft_stages, args.dspark_target_layer_ids, args.dtype) == (1, (7, 8, 9), "fp8")
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == {s.name for s in tensor_inventory(args)} and "mtp.1.norm.weight" not in index
    assert {"mtp.0.main_proj.scale", "mtp.0.markov_head.embed.weight"} <= set(index)
    assert len(model.mtp) == 1 and model.mtp[0].main_proj.in_features == 3 * args.dim
    # the drafter's weights as stored: the source rounded to its storage format, nothing else lost
    expected = Transformer(args, dtype=torch.float32)
    bf16 = {s.name for s in tensor_inventory(args) if s.dtype == "BF16"}
    expected.load_state_dict({n: t.bfloat16().float() if n in bf16 else t for n, t in source.state_dict().items()})
    round_trip_weights(expected)
    held = load_official_model(out, token_map=token_map, quantized=False)[1].state_dict()
    assert all(torch.equal(held[n], t) for n, t in expected.state_dict().items() if n.startswith("mtp."))
    plain = generate(model, PROMPTS[:2], GenerationRequest.of(10, seed=0))
    assert generate_speculative(model, PROMPTS[:2], GenerationRequest.of(10, seed=0)).tokens == plain.tokens
