"""Engram kernels vs engine.model.engram.Engram: exact hashed row gather, gate and add per stream."""
from types import SimpleNamespace

import pytest
import torch

from engine.kernels import launch  # noqa: E402
from engine.kernels.runtime import KernelInputError  # noqa: E402
from engine.model.engram import Engram  # noqa: E402
from tests.kernel_helpers import DEVICE, MODES, TOL, assert_close, assert_equal, randn


def _engram(dim, cols, head_dim, n_rows, *, dtype, seed, hc=4):
    args = SimpleNamespace(hc_mult=hc, dim=dim, norm_eps=1e-6, engram_layer_ids=[3], engram_head_dim=head_dim,
                           engram_n_columns=cols)
    e = Engram(args, 3, n_rows, dtype=dtype).to(DEVICE).requires_grad_(False)
    for i, p in enumerate(e.parameters()):
        scale = 1.0 if p is e.embed.weight else (0.5 if p.dim() == 2 and p.size(0) == hc else p.size(1) ** -0.5)
        p.copy_(randn(*p.shape, seed=seed + i, scale=scale, dtype=dtype) + (1 if p.size(0) == hc else 0))
    return e


def _kernel_forward(e, h, ids, live):
    rows = launch.engram_gather(e.embed.weight, ids)
    kv = e.wkv(rows)
    return launch.engram_gate_add(h, kv, e.q_weight, e.k_weight, eps=e.eps, live=live)


# (B, S, hc, dim, columns, head_dim, table rows, with a live mask)
CASES = [(1, 1, 4, 64, 4, 8, 100, False), (2, 3, 4, 37, 3, 5, 50, True), (1, 2, 2, 300, 6, 16, 999, True),
         (1, 2, 4, 5120, 1, 1, 7, False)]                               # full dim with a 1-wide table


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-S{}-hc{}-dim{}-cols{}-hd{}-R{}-live{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_engram_matches_module(mode, case, dtype):
    B, S, hc, dim, cols, hd, R, masked = case
    e = _engram(dim, cols, hd, R, dtype=dtype, seed=dim, hc=hc)
    h = randn(B, S, hc, dim, seed=dim + 1, dtype=dtype)
    ids = torch.randint(0, R, (B, S, cols), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    live = (torch.arange(B * S).view(B, S) % 3 != 1).to(DEVICE) if masked else None
    out, gates = _kernel_forward(e, h, ids, live)
    r_out, r_gates = e(h, ids, live)
    tol = TOL[torch.float32] * (10 if dim > 1000 else 2)
    assert_close(gates, r_gates, tol, "gates")
    assert_close(out, r_out, max(tol, TOL[dtype]), "streams after the add")
    if masked:
        assert_equal(gates[~live], torch.zeros_like(gates[~live]), "gates of dead tokens")
        assert_equal(out[~live], h[~live], "dead tokens' streams unchanged")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gather_is_exact_at_full_width(mode, dtype):
    """24 columns × head_dim 256 (V4.1-Flash's Engram row) copied bit for bit."""
    table = randn(300, 256, seed=5, dtype=dtype)
    ids = torch.randint(0, 300, (2, 3, 24), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    assert_equal(launch.engram_gather(table, ids), table[ids].flatten(-2), "gathered rows")


def test_engram_launchers_reject_bad_inputs():
    table = randn(10, 4, seed=7)
    with pytest.raises(KernelInputError, match="row_ids has dtype"):
        launch.engram_gather(table, torch.zeros(2, 3, device=DEVICE))
    if DEVICE.type == "cpu":
        with pytest.raises(KernelInputError, match="row ids must lie in 0..9"):
            launch.engram_gather(table, torch.full((2, 3), 10, device=DEVICE))
    h = randn(1, 2, 4, 8, seed=8)
    w = torch.ones(4, 8, device=DEVICE)
    with pytest.raises(KernelInputError, match=r"kv has shape \[1, 2, 32\]; expected \[1, 2, 40\]"):
        launch.engram_gate_add(h, randn(1, 2, 32, seed=9), w, w, eps=1e-6)
    with pytest.raises(KernelInputError, match="live has dtype"):
        launch.engram_gate_add(h, randn(1, 2, 40, seed=9), w, w, eps=1e-6, live=torch.ones(1, 2, device=DEVICE))
