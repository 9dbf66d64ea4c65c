"""The V4 family on the engine's one code path: roles, names, hash routing, exact caches (CSA overlap and HCA
groups left open across calls, rollback), DSpark greedy = plain greedy, the CLI, and both checkpoint layouts
of the engine's own formats (the transformers layout and the oracle are in test_hf_differential.py)."""
from __future__ import annotations

import pytest
import torch

from engine.accounting.inventory import tensor_inventory
from engine.checkpoint.official_layout import official_args
from engine.checkpoint.official_load import load_official_model
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.store import load_checkpoint, save_checkpoint
from engine.cli import main
from engine.generation import DSparkConfig, generate, generate_speculative
from engine.graphs.safety import check_capture_safe, check_draft_capture_safe
from engine.model import EngineOptions, Transformer, init_weights
from engine.quant.apply import round_trip_weights
from engine.request import GenerationRequest
from engine.spec.config import load_config
from engine.spec.roles import family_roles
from engine.speedups import prepare_for_inference
from tests.model_helpers import RecordingTrace, random_tokens

V = 2048
# tiny-v4 with a small vocabulary and HCA ratio 8 instead of 128, so that HCA groups complete in short sequences
SHORT_HCA = (0, 0, 4, 8, 4, 8, 4, 0, 0, 0)


def v4_args(**changes):
    a = load_config("configs/tiny-v4.json").replace(vocab_size=V, dspark_noise_token_id=V - 1)
    return a.replace(**changes) if changes else a


def v4_model(dtype=torch.float64, seed: int = 0, options: EngineOptions | None = None, **changes) -> Transformer:
    m = prepare_for_inference(Transformer(v4_args(**changes), dtype=dtype, options=options))
    init_weights(m, seed)
    return m.eval()


@pytest.fixture(scope="module")
def model():
    return v4_model(compress_ratios=SHORT_HCA)


def test_roles_of_the_v4_preset():
    a = load_config("configs/tiny-v4.json")
    roles = a.roles
    assert a.family == "v4" and [r.hash_routed for r in roles[:a.n_layers]] == [True, True] + [False] * 5
    assert [r.attn_kind for r in roles[:a.n_layers]] == ["SWA", "SWA", "CSA", "HCA", "CSA", "HCA", "CSA"]
    assert all(r.kv_mode == "own" and r.kv_source == r.layer for r in roles if r.ratio)      # no shared KV in V4
    assert [r.indexer for r in roles if r.ratio] == ["own", "none", "own", "none", "own"]    # HCA has no indexer
    assert "hash-routed" in roles[0].summary and roles[-1].draft
    v4, v41 = family_roles(a), family_roles(load_config("configs/tiny-v4.1.json"))
    assert (v4.single_pass_mhc, v4.hc_head, v4.q_head_norm, v4.overlap_ratio) == (False, True, True, 4)
    assert (v41.single_pass_mhc, v41.hc_head, v41.q_head_norm, v41.overlap_ratio) == (True, False, False, 0)


# V4-Flash without DSpark: one plain MTP layer after the backbone
PLAIN_MTP = dict(dspark_block_size=0, dspark_target_layer_ids=(), dspark_markov_rank=0, n_mtp_layers=1,
                 compress_ratios=SHORT_HCA[:8])


def test_state_dict_is_the_official_inventory():
    """Module names are checkpoint names: the plain (bf16) inventory of the V4-DSpark preset, name for name and
    shape for shape; the hash table is int64, and the drafter's last stage has its own hc_head and markov_w1/w2.
    Without DSpark (V4-Flash), the MTP layer's e_proj / h_proj / enorm / hnorm / hc_head are there too."""
    plain = v4_args(dtype="bf16", expert_dtype="", **PLAIN_MTP)
    names = set(Transformer(plain, dtype=torch.float32).state_dict())
    assert names == {spec.name for spec in tensor_inventory(plain)}
    assert {"mtp.0.e_proj.weight", "mtp.0.hnorm.weight", "mtp.0.hc_head_fn", "mtp.0.ffn.gate.bias"} <= names
    a = v4_args(dtype="bf16", expert_dtype="")
    model = Transformer(a, dtype=torch.float32)
    state = {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}
    inventory = {s.name: (s.shape, s.dtype) for s in tensor_inventory(a)}
    assert set(state) == set(inventory)
    assert all(state[n][0] == inventory[n][0] for n in state)
    assert state["layers.0.ffn.gate.tid2eid"] == ((V, 2), torch.int64)
    assert inventory["layers.0.ffn.gate.tid2eid"][1] == "I64"
    assert "layers.0.ffn.gate.bias" not in state and "layers.2.ffn.gate.bias_vl" not in state
    assert {"hc_head_fn", "mtp.2.hc_head_scale", "mtp.2.markov_head.markov_w1.weight",
            "layers.2.attn.indexer.compressor.ape", "layers.3.attn.compressor.ape"} <= set(state)
    assert state["layers.2.attn.compressor.wkv.weight"][0] == (2 * a.head_dim, a.dim)     # CSA: two windows' channels
    assert state["layers.3.attn.compressor.wkv.weight"][0] == (a.head_dim, a.dim)


def test_hash_layers_route_by_the_token_table(model):
    tokens = random_tokens(2, 11, seed=1, vocab=V)
    trace = RecordingTrace(attention=False)
    with torch.no_grad():
        model(tokens, trace=trace)
    by_path = {r["path"]: r for r in trace.moe}
    for layer in (0, 1):
        table = model.layers[layer].ffn.gate.tid2eid
        assert torch.equal(by_path[f"layers.{layer}.ffn"]["ids"], table[tokens])
        assert all(len(set(row.tolist())) == 2 for row in table[:100])    # init draws k distinct experts per token
    assert not torch.equal(by_path["layers.2.ffn"]["ids"].sort(-1).values,
                           model.layers[0].ffn.gate.tid2eid[tokens].sort(-1).values)


@pytest.mark.parametrize("quant_sim", [False, True], ids=["exact", "quant-sim"])
def test_cached_chunks_equal_one_full_forward(quant_sim):
    """Prefill 13 tokens, then chunks of 1, 3, 2, 6, 1, 5, 9: CSA windows (4, overlapping) and HCA groups (8) are
    left open across calls and finished later; every position's logits equal one forward over all 40 tokens."""
    m = v4_model(options=EngineOptions(quant_sim=quant_sim), compress_ratios=SHORT_HCA)
    tokens = random_tokens(2, 40, seed=2, vocab=V)
    with torch.no_grad():
        full = m(tokens, logits="all").logits
        cache = m.new_cache(2, 48)
        parts, start = [], 0
        for n in (13, 1, 3, 2, 6, 1, 5, 9):
            parts.append(m(tokens[:, start:start + n], cache, logits="all").logits)
            start += n
    diff = (torch.cat(parts, 1) - full).abs().max().item()
    print(f"max |chunked − full| logit difference: {diff:.3g}")
    assert diff < 1e-10


@pytest.mark.parametrize("prefix", [22, 27])
def test_rollback_then_redecode_equals_never_having_decoded(model, prefix):
    """A rejected draft block is written and taken back; decoding on equals a cache that never saw it, the
    pending CSA/HCA rings (an open group, and the overlap's previous window), compressed rows and index keys too."""
    tokens = random_tokens(1, prefix + 6, seed=3, vocab=V)
    other = random_tokens(1, 6, seed=7, vocab=V)
    with torch.no_grad():
        clean = model.new_cache(1, 40)
        model(tokens[:, :prefix], clean)
        ref = model(tokens[:, prefix:], clean, logits="all").logits
        rolled = model.new_cache(1, 40)
        model(tokens[:, :prefix], rolled)
        model(other, rolled)
        rolled.rollback(prefix)
        again = model(tokens[:, prefix:], rolled, logits="all").logits
    assert torch.equal(again, ref)
    state, want = rolled.live_state(0), clean.live_state(0)
    assert state.keys() == want.keys() and {"pending_kv.2.indexer", "pending_gate.3", "comp_kv.3"} <= set(want)
    assert "index_k.3" not in want                            # an HCA layer keeps no index keys
    assert all(torch.equal(state[k], want[k]) for k in want)


@pytest.mark.slow  # speculative and plain V4 runs [5 s]
def test_dspark_greedy_equals_plain_greedy():
    m = v4_model(dtype=torch.float32, vocab_size=64, dspark_noise_token_id=63, compress_ratios=SHORT_HCA)
    prompts = [[0, 5, 7, 9, 11], [0, 10, 20], [0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
    plain = generate(m, prompts, GenerationRequest.of(16, seed=0))
    # rows at different positions share each call (the compressors' per-row groups): each row as if alone
    assert [generate(m, [p], GenerationRequest.of(16, seed=0)).tokens[0] for p in prompts] == plain.tokens
    spec = generate_speculative(m, prompts, GenerationRequest.of(16, seed=0, dspark=DSparkConfig("all")))
    assert spec.tokens == plain.tokens
    assert spec.metrics.drafted > 0 and spec.metrics.target_forwards < 16


# plain and DSpark decoding through the static (CUDA-graph) bodies, both capture-safety checks [~6 s]
@pytest.mark.slow
def test_static_decode_and_draft_bodies_decode_like_eager():
    """The CUDA-graph bodies (static shapes, no host reads; run eagerly on the CPU) give the eager tokens for V4,
    and neither body reads a value back to the host (the meta-device check)."""
    m = v4_model(dtype=torch.float32, vocab_size=64, dspark_noise_token_id=63, compress_ratios=SHORT_HCA)
    prompts = [[0, 5, 9, 20, 7, 7, 3, 1, 9], [0, 7]]
    plain = generate(m, prompts, GenerationRequest.of(12, stop_tokens=()))
    assert generate(m, prompts, GenerationRequest.of(12, stop_tokens=(), cuda_graphs=True)).tokens == plain.tokens
    spec = generate_speculative(m, prompts, GenerationRequest.of(12, stop_tokens=(), cuda_graphs=True))
    assert spec.tokens == plain.tokens and spec.graphed_forwards == spec.target_forwards > 0
    check_capture_safe(m.args, batch=2)
    check_draft_capture_safe(m.args, batch=2)


def test_cli_generates_with_the_dspark_drafter(capsys):
    assert main(["generate", "--config", "tiny-v4", "--random-init", "--prompt", "hi", "--dspark",
                 "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hi") and len(out) > 3       # the prompt, then the drafted-and-verified continuation
    assert "tiny-v4" in err and "DSpark:" in err and "accepted" in err


def test_project_checkpoint_round_trip(model, tmp_path):
    save_checkpoint(model, tmp_path / "v4")
    args, loaded = load_checkpoint(tmp_path / "v4", dtype=torch.float64)
    assert args == model.args and torch.equal(loaded.layers[1].ffn.gate.tid2eid, model.layers[1].ffn.gate.tid2eid)
    tokens = random_tokens(1, 12, seed=4, vocab=V)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)


# writes, reads and runs two tiny V4 official-format checkpoints, quantized and dequantized [~4 s each]
@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["dspark", "plain-mtp"])
def test_official_layout(drafter, tmp_path):
    """engine quantize's official layout of a V4-DSpark model (FP8 128×128 blocks, MXFP4 experts, BF16 compressors,
    I64 hash tables, F32 ape / hc_head, the drafter's markov_w1/w2) and of a V4-Flash one (its plain MTP layer)
    holds every weight as stored (the source rounded to its storage format, nothing else lost); loaded quantized it
    computes what the dequantized load computes, and the DSpark drafter drafts greedily like plain decoding."""
    source = v4_model(dtype=torch.float32, **(dict(compress_ratios=SHORT_HCA) if drafter == "dspark" else PLAIN_MTP))
    save_checkpoint(source, tmp_path / "src")
    out = tmp_path / "official"
    write_official(tmp_path / "src", out)
    args, quantized = load_official_model(out)
    _, dequantized = load_official_model(out, quantized=False)
    assert args == official_args(source.args) and quantized.layers[0].ffn.gate.tid2eid.dtype == torch.int64
    expected = prepare_for_inference(Transformer(args, dtype=torch.float32))
    stored_bf16 = {spec.name for spec in tensor_inventory(args) if spec.dtype == "BF16"}
    expected.load_state_dict({n: t.bfloat16().float() if n in stored_bf16 else t
                              for n, t in source.state_dict().items()})
    round_trip_weights(expected)
    held = dequantized.state_dict()
    assert all(torch.equal(held[n], t) for n, t in expected.state_dict().items())
    tokens = random_tokens(2, 20, seed=5, vocab=V)
    with torch.no_grad():
        a, b = quantized(tokens, logits="all").logits, dequantized(tokens, logits="all").logits
    diff = (a - b).abs().max().item()
    print(f"max |quantized − dequantized| logit difference: {diff:.3g}")
    assert diff <= 1e-5 * b.abs().max().item()
    if drafter == "dspark":
        prompts = [[0, 5, 7, 9], [0, 3, 3]]
        plain = generate(quantized, prompts, GenerationRequest.of(8, seed=0))
        assert generate_speculative(quantized, prompts, GenerationRequest.of(8, seed=0)).tokens == plain.tokens


@pytest.mark.parametrize("layout", ["project", "official"])
def test_a_hash_table_naming_experts_the_gate_lacks_is_refused(model, layout, tmp_path):
    """A `tid2eid` entry past the last expert would index beyond the expert list at run time: both loaders refuse
    it up front, naming the tensor, the ids it holds and the range the gate has."""
    from safetensors.torch import load_file, save_file

    from engine.checkpoint.errors import CheckpointError
    save_checkpoint(model, tmp_path / "src")
    folder = tmp_path / "src"
    if layout == "official":
        folder = write_official(tmp_path / "src", tmp_path / "official").folder
    name = "layers.1.ffn.gate.tid2eid"
    n_experts = model.args.n_routed_experts
    file = next(f for f in sorted(folder.glob("*.safetensors")) if name in load_file(f))
    tensors = load_file(file)
    tensors[name] = tensors[name].clone()
    tensors[name][7, 0] = n_experts            # one id past the last expert
    save_file(tensors, file)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(folder) if layout == "project" else load_official_model(folder)
    message = str(caught.value)
    assert f"'{name}' names expert ids 0..{n_experts}" in message and f"0..{n_experts - 1}" in message
    assert file.name in message
