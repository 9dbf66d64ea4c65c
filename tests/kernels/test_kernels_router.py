"""Router kernel vs engine.model.moe.Gate: sqrt-softplus scores, selection bias, top-k, renormalise, scale."""
from types import SimpleNamespace

import pytest
import torch

from engine.kernels import launch  # noqa: E402
from engine.kernels.runtime import KernelInputError  # noqa: E402
from engine.model.moe import Gate  # noqa: E402
from tests.kernel_helpers import DEVICE, MODES, TOL, assert_close, assert_equal, randn


def _gate(dim, E, k, *, dtype, seed, temp=1.0, norm=True, route_scale=1.5):
    args = SimpleNamespace(dim=dim, route_scale=route_scale, gate_temp=temp, norm_topk_prob=norm, family="v4.1",
                           vision_enabled=True)
    g = Gate(args, E, k, dtype=dtype).to(DEVICE).requires_grad_(False)
    g.weight.copy_(randn(E, dim, seed=seed, scale=2 * dim ** -0.5, dtype=dtype))
    g.bias.copy_(randn(E, seed=seed + 1, scale=0.3))                   # large enough to change the selection
    g.bias_vl.copy_(randn(E, seed=seed + 2, scale=0.3))
    return g


def _run(g, x, vision=None):
    return launch.route(x, g.weight, g.bias, topk=g.topk, temp=g.temp, route_scale=g.route_scale,
                        normalize=g.norm_topk, bias_vl=None if vision is None else g.bias_vl, vision=vision)


# (tokens, dim, experts, k, temperature, renormalise)
CASES = [(1, 64, 8, 2, 1.0, True), (7, 45, 7, 3, 1.0, True), (5, 33, 16, 1, 1.0, True),
         (4, 40, 12, 4, 0.7, False), (3, 5120, 384, 6, 1.0, True)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "N{}-dim{}-E{}-k{}-t{}-{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_router_matches_gate(mode, case, dtype):
    N, dim, E, k, temp, norm = case
    g = _gate(dim, E, k, dtype=dtype, seed=N + dim, temp=temp, norm=norm)
    x = randn(N, dim, seed=dim, dtype=dtype)
    weights, ids, chosen = _run(g, x)
    r_w, r_ids, r_chosen = g(x)
    assert_equal(ids, r_ids, "expert ids (selected by score + bias, in descending order)")
    tol = TOL[torch.float32] * (10 if dim > 1000 else 1)                # fp32 dot over dim either way
    assert_close(chosen, r_chosen, tol, "raw scores of the chosen")
    assert_close(weights, r_w, tol, "routing weights")
    if norm and k > 1:
        assert_close(weights.sum(-1), torch.full((N,), g.route_scale, device=DEVICE), 1e-5, "weight sums")


@pytest.mark.parametrize("mode", MODES)
def test_router_vision_tokens_use_their_own_bias(mode):
    g = _gate(32, 10, 3, dtype=torch.float32, seed=5)
    x = randn(6, 32, seed=6)
    vision = torch.tensor([True, False, True, True, False, False], device=DEVICE)
    weights, ids, chosen = _run(g, x, vision)
    r_w, r_ids, r_chosen = g(x, vision)
    assert_equal(ids, r_ids, "expert ids")
    assert_close(weights, r_w, TOL[torch.float32], "routing weights")
    text_ids = _run(g, x)[1]
    assert not torch.equal(text_ids[vision], ids[vision]), "the vision bias should change some selections"


@pytest.mark.parametrize("mode", MODES)
def test_router_softplus_is_accurate_far_from_zero(mode):
    """Logits of ±30: softplus switches to identity above 20 and needs log1p accuracy far below zero."""
    g = _gate(16, 8, 8, dtype=torch.float32, seed=7)
    g.bias.zero_()
    x = torch.zeros(2, 16, device=DEVICE)
    x[0, 0], x[1, 0] = 30.0, -30.0
    g.weight.zero_()
    g.weight[:, 0] = torch.linspace(-1, 1, 8, device=DEVICE)
    weights, ids, chosen = _run(g, x)
    r_w, r_ids, r_chosen = g(x)
    assert_equal(ids, r_ids, "expert ids")
    assert_close(chosen, r_chosen, 1e-5, "sqrt-softplus scores")
    assert chosen.min() > 0                                              # e^-30 survives, not rounded to 0


def test_router_launcher_rejects_bad_inputs():
    g = _gate(16, 8, 2, dtype=torch.float32, seed=8)
    x = randn(3, 16, seed=9)
    with pytest.raises(KernelInputError, match="topk must lie in 1..8"):
        launch.route(x, g.weight, g.bias, topk=9)
    with pytest.raises(KernelInputError, match=r"weight has shape \[8, 16\]; expected \[\*, 15\]"):
        launch.route(x[:, :15], g.weight, g.bias, topk=2)
    with pytest.raises(KernelInputError, match="bias has dtype"):
        launch.route(x, g.weight, g.bias.half(), topk=2)
    with pytest.raises(KernelInputError, match="vision given without bias_vl"):
        launch.route(x, g.weight, g.bias, topk=2, vision=torch.ones(3, dtype=torch.bool, device=DEVICE))
