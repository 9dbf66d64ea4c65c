"""mHC seam kernel vs engine.model.mhc: mixes + Sinkhorn, collapse, expand, alone and fused, several widths."""
import pytest
import torch

from engine.kernels import launch  # noqa: E402  (after the helpers chose the Triton mode)
from engine.kernels.runtime import KernelInputError  # noqa: E402
from engine.model.mhc import collapse, expand, hc_mixes  # noqa: E402
from tests.kernel_helpers import DEVICE, MODES, TOL, assert_close, randn

ITERS, HC_EPS, NORM_EPS = 20, 1e-6, 1e-6


def _site(hc: int, D: int, seed: int):
    mix = (2 + hc) * hc
    fn = randn(mix, hc * D, seed=seed, scale=(hc * D) ** -0.5 * 3)   # logits of order 1..3: Sinkhorn has work to do
    scale = randn(3, seed=seed + 1, scale=0.2) + 1
    base = randn(mix, seed=seed + 2, scale=0.5)
    return dict(fn=fn, scale=scale, base=base)


def _reference_mixes(x, site):
    return hc_mixes(x, site["fn"], site["scale"], site["base"], ITERS, HC_EPS, NORM_EPS)


SHAPES = [(1, 1, 4, 64), (2, 3, 4, 37), (1, 2, 4, 300), (1, 2, 2, 16), (3, 1, 1, 5)]


ENTRY_CASES = [(s, torch.float32) for s in SHAPES] + [(SHAPES[0], torch.bfloat16), (SHAPES[2], torch.bfloat16)]
MIDDLE_CASES = [(s, torch.float32) for s in SHAPES[:4]] + [(SHAPES[1], torch.bfloat16)]


def _case_id(case):
    return "x".join(map(str, case[0])) + "-" + str(case[1]).removeprefix("torch.")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,dtype", ENTRY_CASES, ids=map(_case_id, ENTRY_CASES))
def test_seam_entry_mixes_and_collapse(mode, shape, dtype):
    B, S, hc, D = shape
    x = randn(*shape, seed=1, dtype=dtype)
    site = _site(hc, D, seed=10)
    carry = torch.rand(B, S, hc, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x_out, pre, post, comb, col = launch.mhc_seam(x, carry=carry, iters=ITERS, hc_eps=HC_EPS, norm_eps=NORM_EPS,
                                                  **site)
    r_pre, r_post, r_comb = _reference_mixes(x, site)
    assert x_out is None
    tol = TOL[torch.float32] * 5                                    # fp32 maths; 20 Sinkhorn rounds
    assert_close(pre, r_pre, tol, "pre")
    assert_close(post, r_post, tol, "post")
    assert_close(comb, r_comb, tol, "comb")
    assert_close(col, collapse(x, carry), TOL[dtype], "collapse")
    assert (comb.sum(-2) - 1).abs().max() < 1e-5                   # the last Sinkhorn step normalises columns


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,dtype", MIDDLE_CASES, ids=map(_case_id, MIDDLE_CASES))
def test_seam_middle_expand_then_mixes_and_collapse(mode, shape, dtype):
    B, S, hc, D = shape
    x = randn(*shape, seed=2, dtype=dtype)
    f = randn(B, S, D, seed=3, dtype=dtype)
    prev = _site(hc, D, seed=20)
    carry, post_in, comb_in = _reference_mixes(x, prev)              # the previous site's pre, post, comb
    site = _site(hc, D, seed=30)
    x_out, pre, post, comb, col = launch.mhc_seam(x, f=f, post_in=post_in, comb_in=comb_in, carry=carry,
                                                  iters=ITERS, hc_eps=HC_EPS, norm_eps=NORM_EPS, **site)
    r_x = expand(f, x, post_in, comb_in)
    assert x_out.dtype == dtype
    assert_close(x_out, r_x, TOL[dtype], "expand")
    r_pre, r_post, r_comb = _reference_mixes(x_out, site)             # mixes of the stored streams
    assert_close(pre, r_pre, TOL[torch.float32] * 5, "pre")
    assert_close(post, r_post, TOL[torch.float32] * 5, "post")
    assert_close(comb, r_comb, TOL[torch.float32] * 5, "comb")
    assert_close(col, collapse(x_out, carry), TOL[dtype], "collapse")


@pytest.mark.parametrize("mode", MODES)
def test_seam_exit_expand_only(mode):
    x = randn(2, 2, 4, 70, seed=4)
    f = randn(2, 2, 70, seed=5)
    post_in = torch.rand(2, 2, 4, generator=torch.Generator().manual_seed(6)).to(DEVICE) * 2
    comb_in = torch.softmax(randn(2, 2, 4, 4, seed=7), -1)
    x_out, pre, post, comb, col = launch.mhc_seam(x, f=f, post_in=post_in, comb_in=comb_in)
    assert pre is None and post is None and comb is None and col is None
    assert_close(x_out, expand(f, x, post_in, comb_in), TOL[torch.float32], "expand")


@pytest.mark.parametrize("mode", MODES)
def test_full_width_mixes(mode):
    """V4.1-Flash width: hc 4 × dim 5120 (20,480 values flattened per token)."""
    x = randn(1, 1, 4, 5120, seed=8)
    site = _site(4, 5120, seed=40)
    _, pre, post, comb, _ = launch.mhc_seam(x, iters=ITERS, hc_eps=HC_EPS, norm_eps=NORM_EPS, **site)
    r_pre, r_post, r_comb = _reference_mixes(x, site)
    tol = TOL[torch.float32] * 20                                   # a 20,480-long fp32 dot product
    assert_close(pre, r_pre, tol, "pre")
    assert_close(post, r_post, tol, "post")
    assert_close(comb, r_comb, tol, "comb")


def test_launcher_rejects_bad_inputs():
    x = randn(1, 2, 4, 16, seed=9)
    site = _site(4, 16, seed=50)
    with pytest.raises(KernelInputError, match="fn has shape"):
        launch.mhc_seam(x, **{**site, "fn": site["fn"][:, :-1]})
    with pytest.raises(KernelInputError, match="power of two"):
        launch.mhc_seam(randn(1, 2, 3, 16, seed=9), carry=torch.ones(1, 2, 3, device=DEVICE))
    with pytest.raises(KernelInputError, match="expand needs"):
        launch.mhc_seam(x, f=randn(1, 2, 16, seed=1))
    with pytest.raises(KernelInputError, match="x has dtype torch.float64"):
        launch.mhc_seam(x.double(), carry=torch.ones(1, 2, 4, device=DEVICE))
    with pytest.raises(KernelInputError, match="at least one"):
        launch.mhc_seam(x)
