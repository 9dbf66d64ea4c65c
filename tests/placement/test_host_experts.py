"""The host-experts placement (one GPU + host RAM): the routed experts live in host memory and run on the host's
CPU, everything else on the device. On this CPU-only machine host and device are both the CPU, so the tests prove
what does not depend on a GPU: the same outputs as the plain placement, every expert parameter where the placement
says and nothing duplicated, the host round trip run, the loaders never putting an expert on the device (a meta
"device" cannot hand values back: an expert allocated there first could not be filled), and the refusals."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.checkpoint.official_load import load_official_model
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.store import load_checkpoint
from engine.cli import main
from engine.generation import Engine
from engine.graphs import GraphedDecoder
from engine.model import EngineOptions
from engine.model.moe import MoE
from engine.placement import HOST, HostExpertsMoE, build_model
from engine.plan import memory_fit
from engine.quant.modules import FP4Linear, QuantMoE
from engine.request import GenerationRequest
from engine.spec.config import load_config
from engine.spec.errors import InputError
from engine.spec.presets import resolve_config

# loads the shipped model and its official copy twice each and generates [100 s on a loaded 2-core machine, 80 of
# them the first generation compiling the C++ CPU kernels of engine/kernels for this checkout]
pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "default"
HOST_OPTIONS = EngineOptions(experts="host")
PROMPT = "ROMEO: what light"


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("official") / "default-fp8"
    write_official(SHIPPED, out, shards=2)
    return out


@pytest.fixture(scope="module")
def token_map():
    return np.arange(load_config(SHIPPED / "config.json").vocab_size) % 5000


def moes(model) -> list[tuple[str, MoE]]:
    return [(path, m) for path, m in model.named_modules() if isinstance(m, MoE)]


def expert_tensors(model) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in model.state_dict(keep_vars=True).items() if ".ffn.experts." in n]


def assert_placed(model, device: torch.device) -> None:
    """Every MoE (the drafter's too) runs its experts on the host; every expert tensor lives there, every other
    tensor on `device`; no storage is held twice and no stacked copy of the experts exists."""
    assert moes(model) and all(isinstance(m, HostExpertsMoE) for _, m in moes(model))
    assert any(p.startswith("mtp.") for p, _ in moes(model))
    experts = dict(expert_tensors(model))
    for name, t in model.state_dict(keep_vars=True).items():
        if t.is_meta and not device.type == "meta":
            continue   # a host-resident Engram table's stand-in (engine.quant.host_engram)
        assert t.device == (HOST if name in experts else device), name
    tensors = [t for t in [*model.parameters(), *model.buffers()] if not t.is_meta]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device == HOST}
    held = sum(t.numel() * t.element_size() for t in tensors if t.device == HOST)
    assert sum(storages.values()) == held                       # each host tensor its own storage, none shared
    for _, m in moes(model):
        assert not {"stacks", "fused_experts"} & set(vars(m))   # FastMoE's stacked expert copies: never made


def prefill_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids]), logits="all").logits


def test_shipped_checkpoint_host_experts_equal_the_plain_placement():
    """Greedy text equal token for token; logits within fp32 rounding, not bit-equal: the plain placement's FastMoE
    runs the experts from fused [W1; W3] stacks (sorted pairs, or dense for this small model) and adds the shared
    expert in the same matmul, while the host runs the reference's per-expert loop: the same sums in another order."""
    plain = Engine.load(checkpoint=SHIPPED)
    placed = Engine.load(checkpoint=SHIPPED, experts="host")
    assert placed.model.options.experts == "host" and plain.model.options.experts == "device"
    assert_placed(placed.model, HOST)
    request = GenerationRequest(max_new_tokens=12)
    a, b = plain.generate_text("ROMEO:", request), placed.generate_text("ROMEO:", request)
    assert a.result.tokens == b.result.tokens and a.texts == b.texts
    ids = plain.encode(PROMPT)
    la, lb = prefill_logits(plain.model, ids), prefill_logits(placed.model, ids)
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-4)
    moved = sum(m.moved_rows for _, m in moes(placed.model))
    assert moved >= len(ids) * placed.args.n_layers   # the host round trip ran in every layer
    assert_placed(placed.model, HOST)                  # generating made no copy of the experts either
    nbytes = sum(t.numel() * t.element_size() for _, t in expert_tensors(placed.model))
    assert nbytes == memory_fit.routed_expert_bytes(placed.args, 4)


def test_shipped_checkpoint_dspark_with_host_experts_keeps_the_text():
    """The drafter's routed experts run on the host too; DSpark stays lossless, so its greedy text is the plain one."""
    plain = Engine.load(checkpoint=SHIPPED)
    placed = Engine.load(checkpoint=SHIPPED, experts="host")
    from engine.generation import DSparkConfig
    request = GenerationRequest(max_new_tokens=10, dspark=DSparkConfig())
    a, b = plain.generate_text("ROMEO:", request), placed.generate_text("ROMEO:", request)
    assert a.result.tokens == b.result.tokens
    assert sum(m.moved_rows for p, m in moes(placed.model) if p.startswith("mtp.")) > 0


def test_official_checkpoint_host_experts_are_bit_equal(official, token_map):
    """Packed MXFP4 experts (QuantMoE) on the host: the same per-expert loop on the same CPU as the plain
    placement's QuantMoE, so logits are bit-equal and the greedy tokens too."""
    _, plain = load_official_model(official, token_map=token_map)
    _, placed = load_official_model(official, token_map=token_map, options=HOST_OPTIONS)
    assert all(type(m) is QuantMoE for _, m in moes(plain))
    assert_placed(placed, HOST)
    assert all(isinstance(e.w1, FP4Linear) and e.w1.weight.dtype == torch.int8
               for _, m in moes(placed) for e in m.experts)
    ids = list(range(3, 40))
    assert torch.equal(prefill_logits(plain, ids), prefill_logits(placed, ids))
    for (name, a), (_, b) in zip(expert_tensors(plain), expert_tensors(placed)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name   # stored codes and scales, bit for bit
    nbytes = sum(t.numel() * t.element_size() for _, t in expert_tensors(placed))
    assert nbytes == memory_fit.routed_expert_bytes(placed.args, 4, official=True)
    plain_engine = Engine.load(checkpoint=official)
    placed_engine = Engine.load(checkpoint=official, experts="host")
    request = GenerationRequest(max_new_tokens=8)
    assert plain_engine.generate([ids[:5]], request).tokens == placed_engine.generate([ids[:5]], request).tokens


def test_the_loaders_allocate_the_experts_on_the_host_directly(official):
    """With a meta "device" the rest of the model gets no values, while every expert holds the checkpoint's: had an
    expert been allocated on the device and then copied, it could not have been filled (a meta tensor has no data
    to copy out)."""
    _, reference = load_official_model(official)
    _, placed = load_official_model(official, device="meta", options=HOST_OPTIONS)
    assert_placed(placed, torch.device("meta"))
    for (name, a), (_, b) in zip(expert_tensors(reference), expert_tensors(placed)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    _, shipped = load_checkpoint(SHIPPED, device="meta", options=HOST_OPTIONS)
    assert_placed(shipped, torch.device("meta"))
    state = load_checkpoint(SHIPPED)[1].state_dict()
    assert all(torch.equal(t, state[n]) for n, t in expert_tensors(shipped))
    random = build_model(resolve_config("tiny-v4.1"), device="meta", options=HOST_OPTIONS)
    assert {t.device for _, t in expert_tensors(random)} == {HOST}
    assert {p.device for n, p in random.named_parameters() if ".ffn.experts." not in n} == {torch.device("meta")}


def test_host_experts_refuse_graphs_torchrun_and_unknown_placements(monkeypatch, capsys):
    placed = Engine.load(checkpoint=SHIPPED, experts="host")
    with pytest.raises(InputError, match=r"CUDA-graphed or compiled decode step with the routed experts on the host"):
        GraphedDecoder(placed.model, placed.model.new_cache(2, 16))
    with pytest.raises(InputError, match=r"EngineOptions.experts must be one of 'device', 'host', got 'gpu'"):
        EngineOptions(experts="gpu")
    assert main(["generate", "--prompt", "ROMEO:", "--experts", "host", "--cuda-graphs"]) == 2
    assert "--experts host runs the routed experts on the host" in capsys.readouterr().err
    assert main(["bench", "--experts", "host", "--compile"]) == 2
    assert "leave out --cuda-graphs and --compile" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match=r"--experts host runs in one process .* under torchrun"):
        Engine.load(checkpoint=SHIPPED, experts="host")


def test_generate_and_bench_take_experts_host(capsys):
    args = ["generate", "--prompt", "ROMEO:", "--max-new-tokens", "5"]
    assert main(args) == 0
    plain = capsys.readouterr()
    assert main([*args, "--experts", "host"]) == 0
    placed = capsys.readouterr()
    assert placed.out == plain.out and "routed experts on the host" in placed.err
    assert main(["bench", "--experts", "host", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1",
                 "--json"]) == 0
    assert '"decode_tokens_per_s"' in capsys.readouterr().out


def test_split_fit_puts_the_experts_against_the_host(monkeypatch):
    """V4.1-Flash's official weights with the experts on the host: the rest fits an 80 GiB GPU, the experts a
    512 GiB host; a host too small is named as the part that does not fit (the host's memory is stubbed)."""
    args = resolve_config("deepseek-v4.1-flash")
    experts = memory_fit.routed_expert_bytes(args, 2, official=True)
    rest = memory_fit.resident_bytes(args, 2, official=True) - experts
    assert rest < 80 * 2**30 < experts
    monkeypatch.setattr(memory_fit, "available_memory", lambda: (512 * 2**30, "a 512 GiB host"))
    memory_fit.check_split_fits(args, 2, True, (80 * 2**30, "an 80 GiB GPU"))
    with pytest.raises(InputError, match=r"for everything but its routed experts, but only 10\.0 GiB"):
        memory_fit.check_split_fits(args, 2, True, (10 * 2**30, "a 10 GiB GPU"))
    monkeypatch.setattr(memory_fit, "available_memory", lambda: (64 * 2**30, "a 64 GiB host"))
    with pytest.raises(InputError, match=r"for its routed experts, kept in host memory, but only 64\.0 GiB"):
        memory_fit.check_split_fits(args, 2, True, (80 * 2**30, "an 80 GiB GPU"))
