"""The CPU C++ kernel of few-row RMSNorms (engine.kernels.cpu_norm): it builds on a machine like CI's, computes what
it says (the sum of squares in double, the product in fp32, bf16 rounded to nearest even) and so equals the
reference up to float rounding, refuses malformed inputs by name, serves the rows FastRMSNorm gives it, and where it
is not built torch's ops run."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import cpu_norm
from engine.model.norm import RMSNorm
from engine.speedups.fast_norm import FastRMSNorm
from engine.speedups.sync_free import sync_free
from tests import model_helpers
from tests.model_helpers import decode_logits

EPS = 1e-6


def kernel():
    module = cpu_norm.load()
    assert module is not None, f"the CPU norm kernel did not build here: {cpu_norm.unavailable_reason()}"
    return module


def rows(shape, dtype, seed: int, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * spread).to(dtype)
    w = (torch.rand(shape[-1], generator=g, dtype=torch.float64) + 0.5).to(dtype)
    return x, w


def as_described(x: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in torch: the factor from a double sum of squares, rounded to fp32, times x in fp32,
    times the weight, then in x's dtype."""
    squares = x.double().square().mean(-1, keepdim=True)
    factor = (1.0 / torch.sqrt(squares + EPS)).float()
    return (x.float() * factor * w32).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 192), (1, 6, 192), (5, 768), (1, 1, 7), (8, 1), (2, 3, 4, 33)])
def test_kernel_computes_its_formula_and_the_reference_up_to_rounding(dtype, shape):
    x, w = rows(shape, dtype, seed=sum(shape))
    got = kernel().rms_norm_rows(x, w.float(), EPS)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, as_described(x, w.float()))           # bf16: torch's round-to-nearest-even as well
    reference = RMSNorm(shape[-1], EPS, dtype=dtype)
    reference.weight.data.copy_(w)
    with torch.no_grad():
        want = reference(x)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22       # one unit in the last place, relative
    assert torch.allclose(got.float(), want.float(), rtol=ulp, atol=0)


def test_ties_round_to_even_and_non_finite_values_stay_non_finite():
    module = kernel()
    # x = ones (mean square 1, factor exactly 1 with eps = 0), so the row comes out as the weight, rounded to bf16:
    # weights halfway between two bf16 values, which must round to the one with the even last bit
    halfway = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 + 2 ** -7, 1 + 2 ** -8 + 2 ** -20])
    got = module.rms_norm_rows(torch.ones(1, 5, dtype=torch.bfloat16), halfway, 0.0)
    assert got[0].float().tolist() == [1.0, 1 + 2 ** -6, -1.0, 2.0, 1 + 2 ** -7]
    assert torch.equal(got[0], halfway.bfloat16())
    bad = torch.tensor([[1.0, float("inf"), 2.0], [float("nan"), 1.0, 1.0], [1.0, 2.0, 3.0]])
    for dtype in (torch.float32, torch.bfloat16):
        out = module.rms_norm_rows(bad.to(dtype), torch.ones(3), EPS).float()
        assert out[0].isnan()[1] and out[1].isnan().all() and out[2].isfinite().all()


def test_kernel_refuses_malformed_inputs_by_name():
    module = kernel()
    x, w = rows((2, 16), torch.float32, seed=0)
    cases = {
        "x must be float32 or bfloat16": (x.half(), w),
        "weight must be float32": (x, w.double()),
        "x and weight must be contiguous": (x.t(), torch.ones(2)),
        "weight must match x's width": (x, w[:-1]),
        "x must have a non-empty last dimension": (x[:, :0], w[:0]),
    }
    for message, inputs in cases.items():
        with pytest.raises(RuntimeError, match=message):
            module.rms_norm_rows(*inputs, EPS)
    with pytest.raises(RuntimeError, match="CPU tensors only"):
        module.rms_norm_rows(x.to("meta"), w.to("meta"), EPS)


def test_fast_norm_gives_the_kernel_a_few_rows_only_and_never_inside_a_static_body(monkeypatch):
    real, calls = kernel(), []
    monkeypatch.setattr(cpu_norm, "load", lambda: calls.append(1) or real)
    norm = FastRMSNorm(192, EPS).eval()
    with torch.inference_mode():
        for n_rows, served in ((1, True), (5, True), (6, True), (7, False)):
            calls.clear()
            x = torch.randn(1, n_rows, 192)
            assert torch.allclose(norm(x), RMSNorm.forward(norm, x), rtol=1e-6, atol=1e-6)
            assert bool(calls) == served, n_rows
        calls.clear()
        with sync_free():
            norm(torch.randn(1, 1, 192))
        assert not calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_decodes_alike_with_the_kernel_and_with_torch_ops(dtype, monkeypatch):
    model = model_helpers.tiny_model(dtype, vocab_size=512, dspark_noise_token_id=511)
    tokens = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(1))
    calls, real = [], kernel()
    monkeypatch.setattr(cpu_norm, "load", lambda: calls.append(1) or real)
    with_kernel = decode_logits(model, tokens)
    assert calls                                                   # the block and the one-token steps
    monkeypatch.setattr(cpu_norm, "load", lambda: None)
    with_ops = decode_logits(model, tokens)
    assert torch.equal(with_kernel.argmax(-1), with_ops.argmax(-1))
    scale = with_ops.float().abs().mean()
    assert (with_kernel.float() - with_ops.float()).abs().max() <= (1e-4 if dtype == torch.float32 else 0.1) * scale


def test_without_the_kernel_torch_ops_run(monkeypatch):
    """Where the kernel did not build (engine.kernels.cpu_extension, tests/kernels/test_cpu_extension.py) one row
    takes the Python path and a few rows torch's fused op."""
    monkeypatch.setattr(cpu_norm, "load", lambda: None)
    norm = FastRMSNorm(64, EPS).eval()
    with torch.inference_mode():
        for n_rows in (1, 6):
            x = torch.randn(1, n_rows, 64)
            assert torch.allclose(norm(x), RMSNorm.forward(norm, x), rtol=1e-6, atol=1e-6)
