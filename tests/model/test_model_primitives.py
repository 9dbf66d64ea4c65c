"""Numeric primitives of the model: RMSNorm, RoPE/YaRN, FP8/FP4 quant-dequant, mHC Sinkhorn, sparse_attn."""
import math

import pytest
import torch

from engine.model.mhc import collapse, expand, hc_mixes, sinkhorn, stochastic_error
from engine.model.norm import RMSNorm
from engine.model.quant import fp4_qdq, fp8_qdq, pow2_scale, round_e2m1
from engine.model.rope import Rotary, apply_rope, rope_frequencies
from engine.model.sparse_attn import sparse_attn, sparse_attn_reference
from engine.spec.config import load_config

V41 = load_config("configs/deepseek-v4.1-flash.json")


def test_rmsnorm_matches_definition():
    x = torch.randn(3, 5, 16)
    n = RMSNorm(16, 1e-20)
    with torch.no_grad():
        n.weight.copy_(torch.linspace(0.5, 2, 16))
    want = n.weight * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-20)
    torch.testing.assert_close(n(x), want)


def test_yarn_frequencies_match_spec_values():
    f = rope_frequencies(64, 160000, 65536, 16, 32, 1)
    assert f[0] == 1.0
    assert f[1].item() == pytest.approx(0.687656, rel=1e-5)
    assert f[2].item() == pytest.approx(0.472871, rel=1e-5)
    assert f[29].item() == pytest.approx(1.20129e-06, rel=1e-4)
    assert f[31].item() == pytest.approx(5.68053e-07, rel=1e-4)
    plain = rope_frequencies(64, 160000, 0, 16, 32, 1)
    torch.testing.assert_close(f[:16], plain[:16])          # pairs below `low` untouched
    torch.testing.assert_close(f[25:], plain[25:] / 16)     # pairs above `high` divided by the factor


def test_rope_is_interleaved_on_last_channels_and_inverts():
    rot = Rotary(4, 10000.0, False, V41)
    x = torch.randn(1, 3, 6)
    pos = torch.tensor([[0, 1, 5]])
    cis = rot.cis(pos)
    y = apply_rope(x, cis)
    torch.testing.assert_close(y[..., :2], x[..., :2])       # nope channels untouched
    theta = 5 * 1.0                                          # pair 0 at position 5 rotates by 5 rad
    a, b = x[0, 2, 2], x[0, 2, 3]
    torch.testing.assert_close(y[0, 2, 2:4], torch.stack([a * math.cos(theta) - b * math.sin(theta),
                                                           a * math.sin(theta) + b * math.cos(theta)]))
    torch.testing.assert_close(apply_rope(y, cis, inverse=True), x)


def test_pow2_scale_is_ceil_log2():
    amax = torch.tensor([448.0, 449.0, 1.0, 3e-3])
    torch.testing.assert_close(pow2_scale(amax, 448.0), 2.0 ** torch.ceil(torch.log2(amax / 448)))


def test_e2m1_rounding_ties():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 0.3, 5.9, -0.0, 2.2])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 0.5, 6.0, -0.0, 2.0])
    got = round_e2m1(v)
    assert torch.equal(got, want) and torch.signbit(got[10])


def test_fp8_qdq_values_are_e4m3_times_pow2_scale():
    torch.manual_seed(0)
    x = torch.randn(4, 64) * 3
    y = fp8_qdq(x)
    s = pow2_scale(x.view(4, 2, 32).abs().amax(-1), 448.0).unsqueeze(-1)
    q = (y.view(4, 2, 32) / s)
    assert torch.equal(q, q.to(torch.float8_e4m3fn).float())  # every value is an e4m3 grid point × s
    assert (y - x).abs().max() <= (x.abs().amax() * 2 ** -4)   # e4m3 has 3 mantissa bits
    assert torch.equal(fp8_qdq(y), y)                            # idempotent


@pytest.mark.parametrize("block,scale", [(32, "ue8m0"), (16, "e4m3")])
def test_fp4_qdq_values_lie_on_the_scaled_e2m1_grid(block, scale):
    torch.manual_seed(1)
    x = torch.randn(3, 64)
    y = fp4_qdq(x, block, scale).view(3, -1, block)
    amax = x.view(3, -1, block).abs().amax(-1, keepdim=True)
    if scale == "ue8m0":
        s = pow2_scale(amax, 6.0)
    else:
        s = (amax / 6).to(torch.float8_e4m3fn).float()
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6.0])
    codes = (y.abs() / s).unsqueeze(-1)
    assert torch.isclose(codes, grid, rtol=0, atol=1e-6).any(-1).all()
    # nearest grid point (round to nearest): error at most half the widest gap (1.0) times the scale
    assert ((y - x.view(3, -1, block)).abs() <= s * 1.0 + 1e-6).all()


def test_sinkhorn_doubly_stochastic_and_products():
    torch.manual_seed(2)
    # logits of the size hc_mixes produces; 20 iterations do not converge for extreme (std ≥ 2) logits
    mats = sinkhorn(torch.randn(50, 4, 4) * 0.5, 20, 1e-6)
    row, col = stochastic_error(mats)
    assert row.max() < 1e-5 and col.max() < 1e-5
    prod = mats[0]
    for m in mats[1:]:
        prod = prod @ m
    assert (prod.sum(-1) - 1).abs().max() < 1e-4 and (prod.sum(-2) - 1).abs().max() < 1e-4
    assert (mats >= 0).all()


def test_hc_mixes_collapse_expand_shapes_and_formulas():
    torch.manual_seed(3)
    B, S, hc, D = 2, 3, 4, 8
    x = torch.randn(B, S, hc, D)
    fn, base, scale = torch.randn(24, hc * D) * 0.1, torch.randn(24), torch.ones(3)
    pre, post, comb = hc_mixes(x, fn, scale, base, 20, 1e-6, 1e-20)
    assert pre.shape == (B, S, hc) and post.shape == (B, S, hc) and comb.shape == (B, S, hc, hc)
    assert ((pre > 0) & (pre < 1 + 2e-6)).all() and ((post > 0) & (post < 2)).all()
    f = torch.randn(B, S, D)
    out = expand(f, x, post, comb)
    b = 2
    want = post[..., b, None] * f + sum(comb[..., a, b, None] * x[:, :, a] for a in range(hc))
    torch.testing.assert_close(out[:, :, b], want)
    torch.testing.assert_close(collapse(x, pre), (pre.unsqueeze(-1) * x).sum(2))


def test_sparse_attn_matches_slow_reference_with_empty_entries():
    torch.manual_seed(4)
    B, S, H, D, N, K = 2, 5, 3, 8, 7, 6
    q, kv, sink = torch.randn(B, S, H, D), torch.randn(B, N, D), torch.randn(H)
    idx = torch.randint(-1, N, (B, S, K))
    idx[0, 0] = -1                                   # an all-empty row gives zeros
    got = sparse_attn(q, kv, sink, idx, 0.3, query_block=2)
    want = sparse_attn_reference(q, kv, sink, idx, 0.3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[0, 0], torch.zeros(H, D))
    # index order is irrelevant
    perm = idx.flip(-1)
    torch.testing.assert_close(sparse_attn(q, kv, sink, perm, 0.3), got)
    _, p, sp = sparse_attn(q, kv, sink, idx, 0.3, return_probs=True)
    total = p.sum(-1) + sp
    assert torch.allclose(total[0, 1:], torch.ones_like(total[0, 1:])) and (sp > 0).all()


def test_sinkhorn_numpy_path_equals_torch_path():
    from engine.speedups.sinkhorn import sinkhorn_numpy
    torch.manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 7, 4, 4, dtype=dtype)
        a = sinkhorn(x, 20, 1e-6)                                             # the torch reference
        b = torch.from_numpy(sinkhorn_numpy(x.numpy(), 20, 1e-6))
        assert b.dtype == dtype
        torch.testing.assert_close(a, b, atol=4 * torch.finfo(dtype).eps, rtol=0)
