"""Checkpoint folders laid out exactly as their real producers write them, loaded through Engine.load and the CLI
(`python -m engine generate --checkpoint DIR`), each generating the tokens of the same weights loaded through the
project's own path:

* DeepSeek's reference: one `model.safetensors` (no index) in the official format (FP8 + E8M0 scales, packed MXFP4
  experts, BF16 / F32 as the release stores them), metadata {"format": "pt"}, and the release's composite
  config.json (its key names, its quantization_config) without a vision tower: a text-only V4.1, whose routers
  hold no `gate.bias_vl` (the reference creates it only when vision is enabled);
* transformers' `save_pretrained` of a V4 model: its saved tensor names, everything in bf16, `model.safetensors`
  or `model-0000i-of-0000N.safetensors` with the index, its own config.json (layer_types, rope_parameters, ...)
  keeping `num_nextn_predict_layers: 1` but no `mtp.*` weights (transformers saves none): the backbone loads and
  the user is told the drafter is absent.

The transformers writer here is checked against transformers itself (test_the_transformers_writer_is_save_pretrained).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.hf_layout import hf_folder
from engine.checkpoint.official_layout import official_args, official_folder
from engine.checkpoint.official_writer import encode, write_official
from engine.checkpoint.store import save_checkpoint
from engine.cli import main
from engine.generation import Engine
from engine.model import Transformer, init_weights
from engine.request import GenerationRequest
from engine.spec.config import ALIASES, ModelArgs, load_config
from tests.hf_helpers import hf_twin  # imports transformers when called (a test dependency: its absence fails)
from tests.model_helpers import VISION, random_tokens, tiny_args

# builds two tiny models, writes eight folders, generates through Engine.load and the CLI, runs transformers [45 s]
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RELEASE = json.loads((ROOT / "configs" / "deepseek-v4.1-flash.json").read_text(encoding="utf-8"))
PROMPT, NEW = "The king", 8
PRODUCED = {"format": "pt"}            # the metadata torch-side safetensors writers (and the release) put in a file


# ---- DeepSeek's reference layout ------------------------------------------------------------------------------

def release_style_config(a: ModelArgs) -> dict:
    """The release's config.json (composite: quantization_config, text_config in HF key names) holding `a`'s
    values, its vision_config left out: a text-only V4.1."""
    rope = {"rope_type": "yarn", "factor": a.rope_factor, "beta_fast": a.beta_fast, "beta_slow": a.beta_slow,
            "original_max_position_embeddings": a.original_seq_len}
    text = {}
    for key, value in RELEASE["text_config"].items():
        field = ALIASES.get(key, key)
        if key == "rope_scaling":
            text[key] = rope
        elif key == "max_position_embeddings":
            text[key] = int(a.original_seq_len * a.rope_factor)
        elif key == "model_type" or field is None or not hasattr(a, field):
            text[key] = value                   # a key without architecture (hidden_act, topk_method, ...)
        else:
            v = getattr(a, field)
            text[key] = list(v) if isinstance(v, tuple) else v
    config = {k: v for k, v in RELEASE.items() if k not in ("text_config", "vision_config", "image_token_id")}
    return {**config, "text_config": text}


def write_reference_folder(source: dict[str, torch.Tensor], a: ModelArgs, out: Path, config: dict) -> Path:
    """What DeepSeek's reference code holds for `a` (every tensor of the official layout, quantized as the release
    stores it) in one model.safetensors, no index; config.json as given. A tensor `source` lacks is left out."""
    stored_args = official_args(a)
    tensors: dict[str, torch.Tensor] = {}
    for spec in inventory_tuple(stored_args):
        if not spec.is_scale and spec.name in source:
            tensors.update(encode(spec, source[spec.name], stored_args))
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata=PRODUCED)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    """A random text-only tiny V4.1 (its drafter included) saved three ways: the project's layout, `engine
    quantize`'s sharded official folder (the project's own path), and the reference's one-file folder."""
    root = tmp_path_factory.mktemp("v41")
    a = tiny_args()
    assert not a.vision_enabled
    model = Transformer(a)
    init_weights(model, 5)
    project = save_checkpoint(model, root / "project").parent
    sharded = write_official(project, root / "sharded", shards=3).folder
    reference = write_reference_folder(load_file(project / "model.safetensors"), a, root / "reference",
                                       release_style_config(a))
    return a, project, sharded, reference


def greedy(engine: Engine) -> tuple[list[int], torch.Tensor]:
    """The greedy new tokens after PROMPT, and the logits of every position of a fixed token row."""
    tokens = engine.generate_text(PROMPT, GenerationRequest.greedy(NEW)).result.tokens[0]
    with torch.no_grad():
        logits = engine.model(random_tokens(1, 12, seed=4), logits="all").logits
    return tokens, logits


def cli_output(folder: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["generate", "--checkpoint", str(folder), "--prompt", PROMPT, "--max-new-tokens", str(NEW), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_reference_folder_is_one_file_and_text_only(v41):
    a, _, _, reference = v41
    assert sorted(p.name for p in reference.iterdir()) == ["config.json", "model.safetensors"]
    assert official_folder(reference) == reference
    with safe_open(str(reference / "model.safetensors"), framework="pt") as f:
        names, metadata = set(f.keys()), f.metadata()
    assert metadata == PRODUCED and not any("bias_vl" in n for n in names)
    assert any(n.startswith("mtp.") for n in names) and "layers.0.ffn.experts.0.w1.scale" in names
    config = json.loads((reference / "config.json").read_text())
    assert "vision_config" not in config and config["quantization_config"] == RELEASE["quantization_config"]
    loaded = load_config(reference / "config.json")
    runtime = dict(max_seq_len=a.max_seq_len, max_position_embeddings=a.max_position_embeddings)
    assert loaded.replace(**runtime) == official_args(a)


def test_a_one_file_reference_folder_generates_what_the_sharded_one_does(v41, capsys):
    """Issue 42: a folder with one model.safetensors and no index crashed (OfficialCheckpoint read the file's
    header before its header cache existed), and a text-only V4.1 config demanded gate.bias_vl."""
    _, _, sharded, reference = v41
    own, one_file = Engine.load(checkpoint=sharded), Engine.load(checkpoint=reference)
    assert one_file.args.dtype == "fp8" and one_file.args.has_dspark and one_file.missing_drafter is None
    tokens, logits = greedy(one_file)
    want_tokens, want_logits = greedy(own)
    assert tokens == want_tokens and len(tokens) == NEW
    assert torch.equal(logits, want_logits)
    text = one_file.tokenizer.decode(tokens)
    code, out, err = cli_output(reference, capsys)
    assert code == 0, err
    assert out.rstrip("\n") == PROMPT + text and f"checkpoint {reference}" in err and "note:" not in err


def test_vision_in_the_config_requires_gate_bias_vl(v41, tmp_path):
    """The same folder with the release's vision_config: every router (backbone and drafter) needs its bias_vl;
    given, it loads into the model; absent, the load names it."""
    a, project, _, _ = v41
    vision = a.replace(**VISION)
    config = {**release_style_config(vision), "vision_config": {**RELEASE["vision_config"], "num_hidden_layers": 1,
                                                                "hidden_size": 32, "num_attention_heads": 2,
                                                                "intermediate_size": 64}}
    source = load_file(project / "model.safetensors")
    missing = write_reference_folder(source, vision, tmp_path / "missing", config)
    with pytest.raises(CheckpointError, match=r"'layers\.0\.ffn\.gate\.bias_vl' is missing: model\.safetensors "
                                              r"does not hold it.*'mtp\.0\.ffn\.gate\.bias_vl'"):
        Engine.load(checkpoint=missing)
    biases = {f"{role.path}.ffn.gate.bias_vl": torch.randn(a.n_routed_experts if role.layer < a.n_layers
                                                           else a.draft_n_routed_experts)
              for role in vision.roles}
    with_bias = write_reference_folder({**source, **biases}, vision, tmp_path / "vision", config)
    engine = Engine.load(checkpoint=with_bias)
    assert engine.args.vision_enabled
    held = engine.model.state_dict()
    assert all(torch.equal(held[n], t) for n, t in biases.items())


# ---- transformers' save_pretrained ----------------------------------------------------------------------------

V4_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
          "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
          "hc_head_scale": "model.hc_head.hc_scale"}


def saved_name(name: str) -> str:
    """The name transformers 5.23's save_pretrained (save_original_format, its default) writes for an official
    one: the official name under `model.` with the main attention's kv_norm as `attn.norm`; `head.weight` as is;
    the anchored top-level names not reverted."""
    if name in V4_TOP:
        return V4_TOP[name]
    if name == "head.weight":
        return name
    return "model." + name.replace(".attn.kv_norm.", ".attn.norm.")


def hf_v4_config(a: ModelArgs) -> dict:
    """The config.json transformers 5.23 writes for a V4 DeepseekV4Config of `a`'s backbone with the release's
    `num_nextn_predict_layers: 1` (key for key; test_the_transformers_writer_is_save_pretrained checks it)."""
    ratios = a.compress_ratios[: a.n_layers]
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    partial = a.rope_head_dim / a.head_dim
    yarn = {"attention_factor": 1.0, "beta_fast": float(a.beta_fast), "beta_slow": float(a.beta_slow),
            "factor": float(a.rope_factor), "original_max_position_embeddings": a.original_seq_len,
            "partial_rotary_factor": partial, "rope_theta": float(a.compress_rope_theta), "rope_type": "yarn",
            "type": "yarn"}
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": a.bos_token_id,
        "compress_rates": {"compressed_sparse_attention": 4,
                           "heavily_compressed_attention": max([r for r in ratios if r not in kinds] or [128])},
        "compress_rope_theta": float(a.compress_rope_theta), "dtype": "bfloat16", "eos_token_id": a.eos_token_id,
        "hc_eps": a.hc_eps, "hc_mult": a.hc_mult, "hc_sinkhorn_iters": a.hc_sinkhorn_iters, "head_dim": a.head_dim,
        "hidden_act": "silu", "hidden_size": a.dim, "index_head_dim": a.index_head_dim,
        "index_n_heads": a.index_n_heads, "index_topk": a.index_topk, "initializer_range": 0.02,
        "layer_types": [kinds.get(r, "heavily_compressed_attention") for r in ratios],
        "max_position_embeddings": int(a.original_seq_len * a.rope_factor), "mlp_bias": False,
        "mlp_layer_types": ["hash_moe" if i < a.n_hash_layers else "moe" for i in range(a.n_layers)],
        "model_type": "deepseek_v4", "moe_intermediate_size": a.moe_inter_dim, "n_routed_experts": a.n_routed_experts,
        "n_shared_experts": a.n_shared_experts, "norm_topk_prob": True, "num_attention_heads": a.n_heads,
        "num_experts_per_tok": a.n_activated_experts, "num_hidden_layers": a.n_layers, "num_key_value_heads": 1,
        "num_nextn_predict_layers": 1, "o_groups": a.o_groups, "o_lora_rank": a.o_lora_rank,
        "output_router_logits": False, "pad_token_id": None, "partial_rotary_factor": partial,
        "q_lora_rank": a.q_lora_rank, "qk_rope_head_dim": a.rope_head_dim, "rms_norm_eps": a.norm_eps,
        "rope_parameters": {"compress": yarn, "main": {"partial_rotary_factor": partial,
                                                       "rope_theta": float(a.rope_theta), "rope_type": "default"}},
        "rope_theta": float(a.rope_theta), "routed_scaling_factor": a.route_scale, "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0, "scoring_func": "sqrtsoftplus", "sliding_window": a.window_size,
        "swiglu_limit": a.swiglu_limit, "tie_word_embeddings": False, "transformers_version": "5.23.0",
        "use_cache": True, "vocab_size": a.vocab_size}


def write_transformers_folder(model: Transformer, out: Path, shards: int = 1) -> Path:
    """What `save_pretrained` writes for `model` cast to bf16: its names and dtypes, metadata {"format": "pt"};
    one model.safetensors, or `shards` files model-0000i-of-0000N.safetensors with model.safetensors.index.json."""
    tensors = {saved_name(n): (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous().clone()
               for n, t in model.state_dict().items()}
    out.mkdir(parents=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata=PRODUCED)
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = names[i::shards]
            save_file({n: tensors[n] for n in part}, str(out / file), metadata=PRODUCED)
            weight_map.update(dict.fromkeys(part, file))
        # total_parameters counts transformers' parameters: not its buffers `tid2eid` and `e_score_correction_bias`
        buffers = (".ffn.gate.tid2eid", ".ffn.gate.bias")
        metadata = {"total_parameters": sum(t.numel() for n, t in tensors.items() if not n.endswith(buffers)),
                    "total_size": sum(t.numel() * t.element_size() for t in tensors.values())}
        index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (out / "config.json").write_text(json.dumps(hf_v4_config(model.args), indent=2) + "\n", encoding="utf-8")
    generation = {"_from_model_config": True, "bos_token_id": model.args.bos_token_id,
                  "eos_token_id": model.args.eos_token_id, "output_attentions": False,
                  "output_hidden_states": False, "transformers_version": "5.23.0", "use_cache": True}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    return out


def v4_backbone() -> Transformer:
    """A random tiny V4 backbone (hash-routed layers, CSA and HCA, hc_head) with bf16-exact weights, as a
    transformers model holds them after loading a bf16 folder."""
    tiny = load_config(ROOT / "configs" / "tiny-v4.json")
    a = tiny.without_drafter().replace(dtype="bf16", expert_dtype="", max_position_embeddings=0)
    model = Transformer(a)
    init_weights(model, 7)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16))
    return model


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    """The V4 backbone saved as transformers does (one file; three shards with the index) and in the project's
    layout (the reference: its own config, the same values)."""
    root = tmp_path_factory.mktemp("v4")
    model = v4_backbone()
    one = write_transformers_folder(model, root / "hf-one")
    sharded = write_transformers_folder(model, root / "hf-sharded", shards=3)
    args = load_config(one / "config.json").without_drafter()   # the HF config's backbone, as the engine reads it
    project = save_checkpoint(model, root / "project", args=args).parent
    return model, one, sharded, project


@pytest.mark.parametrize("layout", ["one", "sharded"])
def test_a_transformers_folder_loads_through_engine_and_cli(v4, layout, capsys):
    """Issue 42: Engine.load passed its config to the checkpoint store, which then skipped the transformers branch
    and refused the folder ("missing 'hc_head_fn', ..."); and num_nextn_predict_layers: 1 without mtp.* weights
    refused the whole folder. Now the backbone loads, generates the project layout's tokens, and the user is told
    that the drafter is absent."""
    _, one, sharded, project = v4
    folder = one if layout == "one" else sharded
    assert hf_folder(folder) == folder and official_folder(folder) is None
    assert load_config(folder / "config.json").n_mtp_layers == 1
    engine, own = Engine.load(checkpoint=folder), Engine.load(checkpoint=project)
    assert engine.args.n_draft_stages == 0 and engine.args.replace(name="") == own.args.replace(name="")
    assert engine.missing_drafter is not None and "holds no mtp.* weights for the 1 MTP draft stage" in \
        engine.missing_drafter
    tokens, logits = greedy(engine)
    want_tokens, want_logits = greedy(own)
    assert tokens == want_tokens and len(tokens) == NEW
    assert torch.equal(logits, want_logits)
    code, out, err = cli_output(folder, capsys)
    assert code == 0, err
    assert out.rstrip("\n") == PROMPT + engine.tokenizer.decode(tokens)
    assert f"[note: drafter absent: {folder} holds no mtp.* weights" in err
    code, out, err = cli_output(folder, capsys, "--dspark")
    assert code == 2 and out == ""
    assert err.startswith(f"error: --dspark: drafter absent: {folder} holds no mtp.* weights") and \
        "DSpark speculative decoding is unavailable" in err


def test_the_transformers_writer_is_save_pretrained(v4, tmp_path):
    """The folders above are what transformers itself writes for the same model: file names, config.json,
    generation_config.json, index metadata, every tensor's name, dtype and bytes."""
    model, one, sharded, _ = v4
    hf = hf_twin(model).to(torch.bfloat16)
    hf.config.num_nextn_predict_layers = 1          # the release's value, which transformers keeps in config.json
    for ours, size in ((one, None), (sharded, "20MB")):
        real = tmp_path / ours.name
        hf.save_pretrained(real, **({} if size is None else {"max_shard_size": size}))
        assert sorted(p.name for p in real.iterdir()) == sorted(p.name for p in ours.iterdir()), ours.name
        for name in ("config.json", "generation_config.json"):
            assert json.loads((real / name).read_text()) == json.loads((ours / name).read_text()), name
        if size is not None:
            indexes = [json.loads((f / "model.safetensors.index.json").read_text()) for f in (real, ours)]
            assert indexes[0]["metadata"] == indexes[1]["metadata"]
            assert sorted(indexes[0]["weight_map"]) == sorted(indexes[1]["weight_map"])
        got, want = stored(ours), stored(real)
        assert sorted(got) == sorted(want)
        assert all(got[n][0] == want[n][0] and torch.equal(got[n][1], want[n][1]) for n in want)


def stored(folder: Path) -> dict[str, tuple[dict, torch.Tensor]]:
    """name → (the file's metadata, tensor) over every safetensors file of a folder."""
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({n: (f.metadata(), f.get_tensor(n)) for n in f.keys()})  # noqa: SIM118 (not iterable)
    return out
