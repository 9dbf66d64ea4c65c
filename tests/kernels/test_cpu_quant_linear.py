"""The CPU C++ kernel of a few rows times an FP8 or MXFP4 weight in its stored codes (engine.kernels.cpu_quant_linear):
it builds on a machine like CI's, equals the dequantize-then-multiply reference up to the order of the additions
(partial scale blocks included), gives each row the same bits whatever the number of rows, lets a NaN scale through
for the non-finite checks, refuses malformed inputs by name, and FastFP8Linear / FastFP4Linear hand it only a few
CPU rows outside autograd and static bodies."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import cpu_quant_linear
from engine.model.linear import Linear
from engine.quant.modules import FP4Linear, FP8Linear
from engine.speedups.fast_quant_linear import FastFP4Linear, FastFP8Linear, code_tables
from engine.speedups.row_invariant import KERNEL_ROWS
from engine.speedups.sync_free import sync_free


def kernel():
    module = cpu_quant_linear.load()
    assert module is not None, f"the CPU quantized-linear kernel did not build here: " \
                               f"{cpu_quant_linear.unavailable_reason()}"
    return module


def quantized(cls, out_features: int, in_features: int, block=(128, 128), seed: int = 0, act_quant: bool = True):
    g = torch.Generator().manual_seed(seed)
    linear = Linear(in_features, out_features, quantized=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=g) * 0.05)
    module = cls.adopt(linear, block)
    module.act_quant = act_quant
    return module


def both(module, x):
    """(reference forward, kernel forward) of `module` on x."""
    base = FP8Linear if isinstance(module, FP8Linear) else FP4Linear
    fast = FastFP8Linear if base is FP8Linear else FastFP4Linear
    with torch.inference_mode():
        module.__class__ = base
        reference = module(x)
        module.__class__ = fast
        return reference, module(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,block", [((96, 256), (128, 128)), ((72, 40), (32, 32)), ((130, 200), (128, 128))])
def test_fp8_rows_equal_the_dequantized_linear(dtype, shape, block):
    module = quantized(FP8Linear, *shape, block=block)
    for n_rows in (1, 6, KERNEL_ROWS):
        x = torch.randn(1, n_rows, shape[1], generator=torch.Generator().manual_seed(n_rows)).to(dtype)
        reference, fast = both(module, x)
        assert fast.dtype == dtype and fast.shape == reference.shape
        tol = 1e-5 if dtype == torch.float32 else 1e-2   # addition order; bf16: one rounding of the output
        torch.testing.assert_close(fast.float(), reference.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 256), (48, 40)])              # 40: a partial last group of 32
def test_fp4_rows_equal_the_dequantized_linear(dtype, shape):
    module = quantized(FP4Linear, *shape, block=(1, 32))
    for n_rows in (1, 5):
        x = torch.randn(n_rows, shape[1], generator=torch.Generator().manual_seed(n_rows)).to(dtype)
        reference, fast = both(module, x)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(fast.float(), reference.float(), rtol=tol, atol=tol)


def test_each_row_has_the_same_bits_whatever_the_number_of_rows():
    module = quantized(FP8Linear, 96, 256, act_quant=False)
    module.__class__ = FastFP8Linear
    x = torch.randn(6, 256)
    with torch.inference_mode():
        block = module(x)
        one_by_one = torch.cat([module(x[i:i + 1]) for i in range(6)])
    assert torch.equal(block, one_by_one)


def test_a_nan_scale_reaches_the_output_as_nan():
    module = quantized(FP4Linear, 64, 64, block=(1, 32), act_quant=False)
    with torch.no_grad():
        module.scale.view(torch.uint8)[3, 1] = 0xFF                   # E8M0's NaN
    reference, fast = both(module, torch.ones(1, 64))
    assert reference[0, 3].isnan() and fast[0, 3].isnan()
    assert fast[0, :3].isfinite().all() and fast[0, 4:].isfinite().all()


def test_malformed_inputs_are_refused_by_name():
    module = kernel()
    codes, pow2, pairs = code_tables()
    w = torch.zeros(64, 64, dtype=torch.uint8)
    s = torch.zeros(2, 2, dtype=torch.uint8)
    x = torch.zeros(2, 64)
    cases = {
        "x must be a contiguous 2-D float32": (x.double(), w, s, 32, 32, codes, pow2),
        "x has 63 columns, the weight 64": (torch.zeros(2, 63), w, s, 32, 32, codes, pow2),
        "weight must be a contiguous 2-D uint8": (x, w.float(), s, 32, 32, codes, pow2),
        "the scale's shape does not match": (x, w, torch.zeros(2, 3, dtype=torch.uint8), 32, 32, codes, pow2),
        "code_values must be a contiguous float32 CPU table of 256": (x, w, s, 32, 32, codes[:10], pow2),
        "scale blocks must be positive": (x, w, s, 0, 32, codes, pow2),
    }
    for message, inputs in cases.items():
        with pytest.raises(RuntimeError, match=message):
            module.fp8_rows(*inputs)
    with pytest.raises(RuntimeError, match="groups of 32"):
        module.fp4_rows(x, torch.zeros(64, 32, dtype=torch.uint8), torch.zeros(64, 3, dtype=torch.uint8), pairs, pow2)


def test_the_fast_linears_give_the_kernel_a_few_cpu_rows_only(monkeypatch):
    real, calls = kernel(), []
    monkeypatch.setattr(cpu_quant_linear, "load", lambda: calls.append(1) or real)
    module = quantized(FP8Linear, 64, 64, block=(32, 32))
    module.__class__ = FastFP8Linear
    with torch.inference_mode():
        for n_rows, served in ((1, True), (KERNEL_ROWS, True), (KERNEL_ROWS + 1, False)):
            calls.clear()
            module(torch.randn(n_rows, 64))
            assert bool(calls) == served, n_rows
        calls.clear()
        with sync_free():
            module(torch.randn(1, 64))
        assert not calls
    calls.clear()
    x = torch.randn(1, 64, requires_grad=True)
    module(x)                                                          # autograd: the reference forward
    assert not calls
