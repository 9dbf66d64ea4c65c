"""Routed-expert kernels vs the reference MoE.routed_experts (sorted): expert tiles, grouped SwiGLU matmuls, combine."""
from types import SimpleNamespace

import pytest
import torch

from engine.kernels import launch  # noqa: E402
from engine.kernels.runtime import KernelInputError  # noqa: E402
from engine.model.moe import MoE  # noqa: E402
from engine.speedups.fast_moe import FastMoE  # noqa: E402
from tests.kernel_helpers import DEVICE, DOT_DTYPES, MODES, NATIVE, TOL, assert_close, assert_equal, randn


def _moe(dim, inter, E, k, *, dtype, seed, limit=10.0):
    args = SimpleNamespace(dim=dim, moe_inter_dim=inter, swiglu_limit=limit, route_scale=1.5, gate_temp=1.0,
                           norm_topk_prob=True, family="v4.1", vision_enabled=False)
    m = FastMoE.adopt(MoE(args, E, k, dtype=dtype).to(DEVICE).requires_grad_(False))  # for its weight stacks
    for i, p in enumerate(m.parameters()):
        if p.dim() == 2:
            p.copy_(randn(*p.shape, seed=seed + i, scale=2 * p.size(1) ** -0.5, dtype=p.dtype))
    return m


def _routing(m, x):
    weights, ids, _ = m.gate(x)
    return weights, ids


# (tokens, dim, inter, experts, k, swiglu limit)
CASES = [(1, 64, 32, 8, 2, 10.0),            # decode: fewer pairs than experts
         (11, 45, 27, 7, 3, 0.5),            # odd sizes; a tight clamp that bites
         (40, 64, 48, 4, 2, 0.0),            # several 16-row tiles per expert; no clamp
         (5, 16, 16, 3, 3, 10.0)]            # every token uses every expert


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "N{}-dim{}-inter{}-E{}-k{}-lim{}".format(*c))
@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
def test_experts_match_sorted_reference(mode, case, dtype):
    N, dim, inter, E, k, limit = case
    m = _moe(dim, inter, E, k, dtype=dtype, seed=N + dim, limit=limit)
    x = randn(N, dim, seed=dim + 1, dtype=dtype)
    weights, ids = _routing(m, x)
    w1, w2, w3 = m.stacked()
    got = launch.moe_experts(x, weights, ids, w1, w2, w3, limit=limit)
    want = MoE.routed_experts(m, x, weights, ids)
    assert got.dtype == torch.float32
    assert_close(got, want, TOL[dtype] * 4, "routed experts' weighted sum")
    if N * k <= E:                                                      # the decode path agrees as well
        assert_close(got, m.gathered_experts(x, weights, ids), TOL[dtype] * 4, "vs the gathered (decode) path")


@pytest.mark.parametrize("mode", MODES)
def test_experts_with_fp8_activation_quant(mode):
    """V4.1-Flash's FP4/FP8 experts quant-dequantize their inputs (x, then h) to FP8 blocks of 32 first."""
    m = _moe(64, 64, 6, 2, dtype=torch.float32, seed=21)
    for e in m.experts:
        e.w1.act_quant = e.w2.act_quant = e.w3.act_quant = True
    x = randn(5, 64, seed=22)
    weights, ids = _routing(m, x)
    w1, w2, w3 = m.stacked()
    want = MoE.routed_experts(m, x, weights, ids)
    got = launch.moe_experts(x, weights, ids, w1, w2, w3, limit=10.0, act_quant=True)
    assert_close(got, want, TOL[torch.float32] * 4, "experts with FP8 activation quant")
    plain = launch.moe_experts(x, weights, ids, w1, w2, w3, limit=10.0)
    assert (plain - got).abs().max() > 1e-3, "the quant-dequant should change the result"


@pytest.mark.parametrize("mode", MODES)
def test_full_width_expert(mode):
    """V4.1-Flash's model width (dim 5120) in fp16, two experts, one token. The full intermediate width
    (2304) natively only: the interpreter's tl.dot runs at ~40 MFLOP/s, so there it is 64."""
    m = _moe(5120, 2304 if NATIVE else 64, 2, 1, dtype=torch.float16, seed=3)
    x = randn(1, 5120, seed=4, dtype=torch.float16)
    weights, ids = _routing(m, x)
    w1, w2, w3 = m.stacked()
    got = launch.moe_experts(x, weights, ids, w1, w2, w3, limit=10.0)
    assert_close(got, MoE.routed_experts(m, x, weights, ids), TOL[torch.float16] * 4, "full-width expert")


@pytest.mark.parametrize("mode", MODES)
def test_expert_tiles_cover_every_pair_once(mode):
    """The tile schedule (pure index work) is exact: tiles are single-expert, ≤ 16 rows, and cover the sorted pairs."""
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2]] * 9, device=DEVICE)    # expert 3 has 27 pairs: two tiles
    order, t_exp, t_start, t_end, slot = launch.expert_tiles(ids, 5, 16)
    flat = ids.flatten()
    assert_equal(flat[order], flat.sort(stable=True).values, "pairs sorted by expert")
    assert_equal(order[slot], torch.arange(flat.numel(), device=DEVICE), "slot inverts the sort")
    covered = torch.zeros(flat.numel(), dtype=torch.long)
    for e, s, t in zip(t_exp.tolist(), t_start.tolist(), t_end.tolist()):
        assert t - s <= 16
        if t > s:
            assert (flat[order][s:t] == e).all(), f"tile [{s}, {t}) mixes experts"
            covered[s:t] += 1
    assert_equal(covered, torch.ones_like(covered), "each sorted pair in exactly one tile")


def test_expert_launcher_rejects_bad_inputs():
    m = _moe(16, 16, 4, 2, dtype=torch.float32, seed=5)
    x = randn(3, 16, seed=6)
    weights, ids = _routing(m, x)
    w1, w2, w3 = m.stacked()
    with pytest.raises(KernelInputError, match=r"w2 has shape \[4, 16, 16\]; expected \[4, 16, 8\]"):
        launch.moe_experts(x, weights, ids, w1[:, :8], w2, w3[:, :8])
    with pytest.raises(KernelInputError, match="weights has dtype"):
        launch.moe_experts(x, weights.half(), ids, w1, w2, w3)
    if DEVICE.type == "cpu":
        with pytest.raises(KernelInputError, match="expert ids must lie in 0..3"):
            launch.moe_experts(x, weights, ids + 4, w1, w2, w3)
