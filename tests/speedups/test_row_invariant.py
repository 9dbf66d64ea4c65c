"""engine.speedups.row_invariant: a few CPU rows give each row the same bits at any row count, so that a DSpark verify
block's first row equals the decode step of the same token bit for bit (every layer's output and the logits) on a
model in the release's storage formats, with and without the reference's activation rounding, and greedy DSpark then
gives plain greedy decoding's tokens."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.dspark.config import DSparkConfig
from engine.generation import Engine
from engine.kernels import cpu_quant_linear
from engine.model.options import EngineOptions
from engine.request import GenerationRequest
from engine.spec.presets import resolve_config
from engine.speedups.row_invariant import KERNEL_ROWS, LANES, few_rows_linear, lanewise
from tests.official_helpers import write_tiny_official

kernel = cpu_quant_linear.load()     # scripts/setup.sh builds it; a failed build fails these tests


def test_the_kernel_built():
    assert kernel is not None, cpu_quant_linear.unavailable_reason()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_has_the_same_bits_at_any_row_count(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(KERNEL_ROWS, 700, generator=g)                 # 700: a partial block of the kernel's 256
    w = torch.randn(300, 700, generator=g).to(dtype)
    with torch.inference_mode():
        many = few_rows_linear(x, w, torch.float32)
        assert many is not None and many.shape == (KERNEL_ROWS, 300)
        for r in (0, 5, KERNEL_ROWS - 1):
            assert torch.equal(few_rows_linear(x[r:r + 1], w, torch.float32)[0], many[r])
        torch.testing.assert_close(many, F.linear(x, w.float()), atol=1e-4, rtol=1e-4)
        # torch's own product does not have this property (else the kernel would not be needed)
        assert not torch.equal(F.linear(x[:1], w.float())[0], F.linear(x, w.float())[0])


def test_which_calls_take_the_kernel():
    w = torch.randn(8, 32)
    with torch.inference_mode():
        assert few_rows_linear(torch.randn(KERNEL_ROWS + 1, 32), w) is None          # a prefill: torch's product
        assert few_rows_linear(torch.randn(2, 32, dtype=torch.float64), w.double()) is None
        assert few_rows_linear(torch.randn(2, 32), w.t().contiguous().t()) is None   # not contiguous
        assert few_rows_linear(torch.randn(1, 3, 32), w).shape == (1, 3, 8)
    x = torch.randn(2, 32, requires_grad=True)
    assert few_rows_linear(x, w) is None                                            # autograd: the reference


def test_the_kernel_refuses_malformed_operands():
    with pytest.raises(RuntimeError, match="columns"):
        kernel.float_rows(torch.randn(2, 31), torch.randn(8, 32))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel.float_rows(torch.randn(2, 32), torch.randn(8, 32, dtype=torch.float64))


def test_lanewise_rounds_each_element_alike_whatever_the_size():
    x = torch.randn(24, generator=torch.Generator().manual_seed(1)) * 4
    with torch.inference_mode():
        assert torch.equal(lanewise(torch.sigmoid, x[:4]), lanewise(torch.sigmoid, x)[:4])
        assert torch.equal(lanewise(F.softplus, x[:4].view(1, 4)), lanewise(F.softplus, x.view(6, 4))[:1])
        torch.testing.assert_close(lanewise(torch.sigmoid, x), torch.sigmoid(x))
        assert lanewise(torch.sigmoid, torch.zeros(LANES)).shape == (LANES,)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """tiny-v4.1 (every layer kind, Engram, a DSpark drafter) in the release's FP8/MXFP4 layout."""
    folder = tmp_path_factory.mktemp("row-invariant") / "official"
    write_tiny_official(folder, resolve_config("tiny-v4.1"), seed=3, shards=2)
    return folder


@pytest.mark.slow  # loads a quantized model twice and runs a prefill, blocks and steps [~10 s]
@pytest.mark.parametrize("options", [EngineOptions(), EngineOptions(act_quant=False, quant_sim=False)],
                         ids=["reference-rounding", "no-activation-rounding"])
def test_a_verify_block_computes_its_first_row_as_a_decode_step(official, options):
    engine = Engine.load(checkpoint=official, options=options)
    model, width = engine.model, engine.args.dspark_block_size + 1
    outputs: dict[str, list[torch.Tensor]] = {}
    hooks = [layer.register_forward_hook(lambda m, i, o: outputs.setdefault(m.path, []).append(o[0].clone()))
             for layer in model.layers]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, engine.args.vocab_size, (40,), generator=gen).tolist()
    with torch.inference_mode():
        cache = model.new_cache(1, 64)
        model(torch.tensor([prompt]), cache)
        for _ in range(4):        # positions 40–43: the block's first row finishes a ratio-2 group, or another row
            block_cache = copy.deepcopy(cache)
            block = torch.randint(3, engine.args.vocab_size, (width,), generator=gen)
            outputs.clear()
            one = model(block[None, :1], cache).logits[0]
            mid = {path: out[0] for path, out in outputs.items()}
            outputs.clear()
            first = model(block[None], block_cache, logits="all").logits[0, 0]
            for path, out in outputs.items():
                assert torch.equal(mid[path], out[0][:, :1]), path
            assert torch.equal(one, first)
    for h in hooks:
        h.remove()


@pytest.mark.slow  # a quantized model's plain and DSpark greedy runs [~10 s]
def test_greedy_dspark_gives_plain_greedy_tokens_on_the_release_formats(official):
    engine = Engine.load(checkpoint=official)
    prompt = torch.randint(3, engine.args.vocab_size, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = engine.generate([prompt], GenerationRequest.of(24, stop_tokens=())).tokens[0]
    spec = engine.generate([prompt], GenerationRequest.of(24, stop_tokens=(), dspark=DSparkConfig())).tokens[0]
    assert spec == plain
