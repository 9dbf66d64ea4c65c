"""The official storage formats (spec §2.2): FP8 with E8M0 block scales, MXFP4 nibbles, Engram row scales."""
from __future__ import annotations

import pytest
import torch

from engine.quant.formats import (
    dequantize_engram_rows,
    dequantize_fp4,
    dequantize_fp8,
    quantize_engram_rows,
    quantize_fp4,
    quantize_fp8,
    unpack_fp4,
    weight_scale,
)
from engine.spec.errors import InputError


def e8m0(codes) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_fp4_nibbles_follow_the_spec_example():
    # spec §2.2: byte 0xA2 with scale code 128 → elements (+2, −2): low nibble 0x2 = +1.0, high 0xA = −1.0, × 2
    packed = torch.full((1, 16), 0xA2 - 256, dtype=torch.int8)
    w = dequantize_fp4(packed, e8m0([[128]]))
    assert w[0, :2].tolist() == [2.0, -2.0] and w.shape == (1, 32)
    assert unpack_fp4(torch.tensor([[0x7F]], dtype=torch.int8)).tolist() == [[-6.0, 6.0]]


def test_fp8_dequant_is_the_code_times_its_block_scale():
    w8 = torch.tensor([[1.5, -3.0], [0.25, 448.0]]).to(torch.float8_e4m3fn)
    assert dequantize_fp8(w8, e8m0([[130]])).tolist() == [[12.0, -24.0], [2.0, 3584.0]]
    big = torch.ones(40, 33).to(torch.float8_e4m3fn)
    scale = e8m0([[127, 128], [126, 131]])                                  # blocks of 32 rows × 32 columns
    d = dequantize_fp8(big, scale)
    assert d[0, 0] == 1 and d[0, 32] == 2 and d[39, 0] == 0.5 and d[39, 32] == 16


@pytest.mark.parametrize("shape", [(64, 64), (70, 96), (5, 34), (33, 1)])
@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 300.0])
def test_fp8_quantization_error_and_exact_requantization(shape, magnitude):
    torch.manual_seed(0)
    w = torch.randn(*shape) * magnitude
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert tuple(s.shape) == (-(-shape[0] // 32), -(-shape[1] // 32))
    d = dequantize_fp8(q, s)
    assert ((d - w).abs() <= w.abs() * 2**-4 + 1e-30).all()                 # e4m3: 3 mantissa bits, RNE
    q2, s2 = quantize_fp8(d)                                                # already representable: same bytes
    assert (torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
            and torch.equal(s2.view(torch.uint8), s.view(torch.uint8)))


@pytest.mark.parametrize("shape", [(16, 64), (7, 34), (3, 2)])
def test_fp4_quantization_is_nearest_on_the_grid_and_stable(shape):
    torch.manual_seed(1)
    w = torch.randn(*shape)
    packed, scale = quantize_fp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (shape[0], shape[1] // 2)
    assert tuple(scale.shape) == (shape[0], -(-shape[1] // 32))
    d = dequantize_fp4(packed, scale)
    step = scale.float().repeat_interleave(32, 1)[:, : shape[1]]            # E2M1 spacing is at most 2 × scale
    assert ((d - w).abs() <= step + 1e-6).all()
    assert torch.equal(dequantize_fp4(*quantize_fp4(d)), d)                 # the values survive requantization


def test_weight_scale_is_the_smallest_sufficient_power_of_two():
    amax = torch.tensor([6.0, 6.000001, 3.0, 1e-3, 448.0])
    assert weight_scale(amax, 6.0).tolist() == [1.0, 2.0, 0.5, 2.0**-12, 128.0]


def test_engram_rows_carry_one_scale_per_32_channels():
    torch.manual_seed(2)
    table = torch.randn(10, 64)
    rows8, scale = quantize_engram_rows(table)
    assert rows8.shape == (10, 64) and scale.shape == (10, 2)
    picked = torch.tensor([[3, 7], [0, 3]])                                 # gathered rows, any batch shape
    d = dequantize_engram_rows(rows8[picked], scale[picked])
    assert d.shape == (2, 2, 64) and torch.equal(d[0, 0], d[1, 1])
    assert ((d[0, 1] - table[7]).abs() <= table[7].abs() * 2**-4 + 1e-30).all()


def test_wrong_shapes_and_dtypes_are_named():
    q, s = quantize_fp8(torch.randn(64, 64))
    with pytest.raises(InputError, match=r"needs a scale of shape \(2, 2\)"):
        dequantize_fp8(q, s[:1])
    with pytest.raises(InputError, match="even number of columns"):
        quantize_fp4(torch.randn(4, 5))
    with pytest.raises(InputError, match="float8_e8m0fnu"):
        dequantize_fp8(q, s.float())
