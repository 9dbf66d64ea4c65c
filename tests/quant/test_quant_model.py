"""quantize_model: official storage name by name, the dequantized run's logits, resident bytes, speed paths kept off."""
from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from engine.accounting.inventory import tensor_inventory
from engine.generation import DSparkConfig, Engine
from engine.model import EngineOptions, Transformer, init_weights
from engine.model.moe import MoE
from engine.quant import HostEngramTable, quantize_model, resident_bytes, round_trip_weights
from engine.quant.apply import DEQUANTIZED_AT_LOAD, HOST_TABLES, quantized_modules
from engine.quant.modules import FP4Linear, FP8Linear, QuantMoE
from engine.request import GenerationRequest
from engine.spec.errors import InputError
from engine.speedups import prepare_for_inference
from tests.model_helpers import random_tokens, synthetic_token_map, tiny_args

STORAGE = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8,
           "BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}


def fp8_args():
    """The tiny config stored as the release stores V4.1-Flash: FP8 dense weights, MXFP4 routed experts."""
    return tiny_args(dtype="fp8", expert_dtype="fp4")


def built(dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> Transformer:
    """The tiny fp8/fp4 model with unquantized random weights, activation quantization on, prepared for
    inference as the engine prepares the models it builds (its MoEs are FastMoEs)."""
    a = fp8_args()
    model = Transformer(a, synthetic_token_map(a), dtype=dtype, device=device, options=EngineOptions(act_quant=True))
    model = prepare_for_inference(model)
    init_weights(model, seed)
    return model.eval()


@pytest.fixture(scope="module")
def bf16_models():
    """(quantized, dequantized reference, unquantized original) from one bf16 model."""
    base = built(torch.bfloat16)
    return quantize_model(copy.deepcopy(base)), round_trip_weights(copy.deepcopy(base)), base


def official_entries(model) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}


def expected_entries(args, compute: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The inventory, except that a DEQUANTIZED_AT_LOAD weight is held in the compute dtype without a scale."""
    out = {}
    for spec in tensor_inventory(args):
        path, _, leaf = spec.name.rpartition(".")
        if path.endswith(DEQUANTIZED_AT_LOAD):
            if leaf == "weight":
                out[spec.name] = (spec.shape, compute)
            continue
        out[spec.name] = (spec.shape, STORAGE[spec.dtype])
    return out


def test_the_tiny_fp8_config_lists_the_official_storage():
    specs = tensor_inventory(fp8_args())
    kinds = Counter(s.dtype for s in specs)
    assert kinds["F8_E4M3"] and kinds["I8"] and kinds["F8_E8M0"] == kinds["F8_E4M3"] + kinds["I8"]
    assert {s.dtype for s in specs if ".ffn.experts." in s.name and s.name.endswith(".weight")} == {"I8"}
    assert {s.dtype for s in specs if s.name.endswith(".engram.embed.weight")} == {"F8_E4M3"}


def test_state_dict_has_the_inventory_names_shapes_and_dtypes(bf16_models):
    quantized, _, _ = bf16_models
    got, want = official_entries(quantized), expected_entries(quantized.args, torch.bfloat16)
    wrong = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
    assert not wrong, [(n, got.get(n), want.get(n)) for n in wrong[:5]]
    kinds = Counter(type(quantized.get_submodule(p)) for p, _ in quantized_modules(quantized.args))
    assert kinds[FP8Linear] and kinds[FP4Linear] and kinds[HostEngramTable] == len(quantized.args.engram_layer_ids)
    assert all(type(m) is QuantMoE for m in quantized.modules() if isinstance(m, MoE))


def test_a_meta_model_gets_meta_storage_of_the_official_shapes():
    a = fp8_args()
    model = quantize_model(Transformer(a, synthetic_token_map(a), dtype=torch.bfloat16, device="meta"))
    assert official_entries(model) == expected_entries(a, torch.bfloat16)
    assert resident_bytes(model) == 0


def test_a_bf16_config_is_refused():
    with pytest.raises(InputError, match="dtype 'fp8'"):
        quantize_model(Transformer(tiny_args(), dtype=torch.bfloat16, device="meta"))


@pytest.mark.slow  # two dtypes [5 + 2 s]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_match_the_dequantized_run_with_activation_quantization(dtype, bf16_models):
    """Prefill, then cached decode steps. Both models multiply the same values: an FP8 / E2M1 code times a
    power of two is exact in bf16 and fp32, and both quantize activations with engine.model.quant.fp8_qdq.
    Differences can come only from accumulation order (the reference's FastMoE gathers experts into a batched
    matmul where QuantMoE loops over them), so the tolerance is accumulation error: 1e-5 of the largest logit
    in fp32, one bf16 ulp of it (2⁻⁷) in bf16. On CPU the two agree exactly today. The unquantized model must
    differ by ten times the tolerance at least (the test has power)."""
    if dtype == torch.bfloat16:
        quantized, reference, base = bf16_models
    else:
        base = built(dtype)
        quantized, reference = quantize_model(copy.deepcopy(base)), round_trip_weights(copy.deepcopy(base))
    tol = 1e-5 if dtype == torch.float32 else 2.0**-7
    tokens = random_tokens(2, 12, seed=3)
    caches = [m.new_cache(2, 64) for m in (quantized, reference, base)]
    with torch.no_grad():
        for step in range(4):
            q, r, b = (m(tokens, c).logits for m, c in zip((quantized, reference, base), caches))
            scale = r.abs().max().item()
            diff = (q - r).abs().max().item()
            print(f"{dtype} step {step}: max |quantized − dequantized| = {diff:.3g} (logit scale {scale:.3g}), "
                  f"vs unquantized {(b - r).abs().max().item():.3g}")
            assert diff <= tol * scale
            assert (b - r).abs().max().item() > 10 * tol * scale
            tokens = r.argmax(-1, keepdim=True)                               # [B, 1] the next decode step


def test_resident_bytes_are_the_checkpoints(bf16_models):
    """Parameters + buffers hold what the checkpoint stores: exactly its bytes, except wo_a (bf16, spec §2.4),
    the host-resident Engram tables (not on the device at all) and the non-persistent buffers (rotary
    frequencies). The quantized weights take about half of their bf16 bytes (FP8: 1 + 1/1024 bytes a weight,
    MXFP4: 1/2 + 1/32), not more."""
    quantized, _, base = bf16_models
    a = quantized.args
    specs = tensor_inventory(a)
    held = 0
    for s in specs:
        path = s.name.rpartition(".")[0]
        if path.endswith(HOST_TABLES) or (path.endswith(DEQUANTIZED_AT_LOAD) and s.name.endswith(".scale")):
            continue
        held += s.params * 2 if path.endswith(DEQUANTIZED_AT_LOAD) else s.nbytes
    state = set(quantized.state_dict())
    transient = sum(b.numel() * b.element_size() for n, b in quantized.named_buffers() if n not in state)
    assert resident_bytes(quantized) == held + transient
    checkpoint = sum(s.nbytes for s in specs)
    print(f"resident {resident_bytes(quantized)} B, checkpoint {checkpoint} B, unquantized {resident_bytes(base)} B")
    assert resident_bytes(quantized) <= 1.01 * checkpoint

    paths = [p for p, _ in quantized_modules(a) if not p.endswith((HOST_TABLES, *DEQUANTIZED_AT_LOAD))]
    quantized_bytes = sum(quantized.get_parameter(f"{p}.{leaf}").nbytes for p in paths for leaf in ("weight", "scale"))
    bf16_bytes = sum(base.get_parameter(f"{p}.weight").nbytes for p in paths)
    assert quantized_bytes < 0.55 * bf16_bytes


def test_speed_transforms_leave_the_quantized_experts_alone(bf16_models):
    """FastMoE would stack every expert's weights: the quantized MoEs must stay QuantMoEs, and running the
    model must not cache any dequantized or stacked weight."""
    quantized, _, _ = bf16_models
    prepare_for_inference(quantized)
    moes = [m for m in quantized.modules() if isinstance(m, MoE)]
    assert moes and all(type(m) is QuantMoE and not hasattr(m, "stacks") for m in moes)
    before = resident_bytes(quantized)
    with torch.no_grad():
        quantized(random_tokens(1, 1, seed=5))                                # decode shape: few (token, expert) pairs
        quantized(random_tokens(3, 9, seed=6))
    assert resident_bytes(quantized) == before


def test_a_model_filled_by_name_from_the_state_dict_computes_the_same(bf16_models):
    """What a loader does: copy each stored tensor into the model's state-dict entry of that name (the
    quantized storage is a view of the parameters), attach the host tables' row sources."""
    quantized, _, _ = bf16_models
    other = quantize_model(built(torch.bfloat16, seed=1), from_values=False)
    target = other.state_dict()
    with torch.no_grad():
        for name, t in quantized.state_dict().items():
            if not t.is_meta:
                target[name].copy_(t)
    for path, _ in quantized_modules(quantized.args):
        if path.endswith(HOST_TABLES):
            source = quantized.get_submodule(path)
            other.get_submodule(path).attach(source.weight_source, source.scale_source)
    tokens = random_tokens(2, 7, seed=7)
    with torch.no_grad():
        assert torch.equal(other(tokens).logits, quantized(tokens).logits)


def test_to_moves_the_storage_but_never_casts_it():
    model = quantize_model(built(torch.bfloat16)).to(torch.float32)
    w1 = model.get_submodule("layers.0.ffn.experts.0.w1")
    assert w1.weight.dtype == torch.int8 and w1.scale.dtype == torch.float8_e8m0fnu
    assert model.get_submodule("layers.0.attn.wq_a").weight.dtype == torch.float8_e4m3fn
    with torch.no_grad():
        logits = model(random_tokens(1, 5, seed=8)).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.mark.slow  # four generations [11 s]
def test_plain_and_dspark_generation_follow_the_dequantized_run():
    """Greedy decoding through the Engine, plain and speculative (the drafter's FP8 main_proj and FP4 experts
    included), gives the dequantized reference's tokens."""
    base = built(torch.float32, seed=2)
    quantized, reference = quantize_model(copy.deepcopy(base)), round_trip_weights(copy.deepcopy(base))
    prompts = [[1, 5, 9, 200, 3000], [7, 8]]
    for dspark in (None, DSparkConfig()):
        got, want = (Engine(m).generate(prompts, GenerationRequest.of(6, dspark=dspark)).tokens for m in (quantized,
                                                                      reference))
        assert got == want
