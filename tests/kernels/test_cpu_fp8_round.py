"""The CPU C++ kernel of FP8 activation rounding (engine.kernels.cpu_fp8_round): bit for bit the reference's
quant.fp8_qdq (the model code's torch ops), NaN, infinities, zero blocks and subnormals included; malformed inputs
refused by name; fast_quant.fp8_qdq takes it only where it applies."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import cpu_fp8_round
from engine.model import quant
from engine.speedups import fast_quant


def kernel():
    module = cpu_fp8_round.load()
    assert module is not None, f"the CPU FP8 rounding kernel did not build here: {cpu_fp8_round.unavailable_reason()}"
    return module


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(view), b.view(view))


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-45, 3.4e38, 448.0, 1e-4, 5e-5]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), exponent=st.integers(-30, 30), block=st.sampled_from([32, 64, 128]),
       blocks=st.integers(1, 6), specials=st.lists(st.sampled_from(SPECIAL), max_size=4))
def test_kernel_equals_the_reference_bit_for_bit(seed, exponent, block, blocks, specials):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, blocks * block, generator=g) * 2.0 ** exponent
    for i, value in enumerate(specials):
        x.view(-1)[(i * 37) % x.numel()] = value
    assert same_bits(kernel().fp8_round(x, block, fast_quant.RECIP_FP8_MAX), quant.fp8_qdq(x, block))
    assert same_bits(fast_quant.fp8_qdq(x, block), quant.fp8_qdq(x, block))


def test_bf16_and_higher_rank_inputs_round_as_the_reference():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 3, 4, 192, generator=g) * 40).bfloat16()
    assert same_bits(fast_quant.fp8_qdq(x, 64), quant.fp8_qdq(x, 64))


def test_partial_blocks_and_float64_keep_the_torch_ops():
    g = torch.Generator().manual_seed(2)
    odd = torch.randn(3, 40, generator=g)                        # 40 = one block of 32 and a partial one
    assert same_bits(fast_quant.fp8_qdq(odd, 32), quant.fp8_qdq(odd, 32))
    wide = torch.randn(3, 64, generator=g, dtype=torch.float64)
    assert torch.equal(fast_quant.fp8_qdq(wide, 32), quant.fp8_qdq(wide, 32))


@pytest.mark.parametrize("bad, block, said", [
    (torch.zeros(2, 40), 32, "multiple of the block"),
    (torch.zeros(2, 64, dtype=torch.float64), 32, "float32"),
    (torch.zeros(4, 64)[:, ::2], 32, "contiguous"),
    (torch.zeros(2, 64), 0, "multiple of the block"),
])
def test_malformed_inputs_are_refused_by_name(bad, block, said):
    with pytest.raises(RuntimeError, match=said):
        kernel().fp8_round(bad, block, fast_quant.RECIP_FP8_MAX)
