"""Distinct experts read by a batch: the closed form against a seeded simulation (seed 000's check)."""
import pytest

from engine.accounting.experts_touched import expected_touched, simulate_touched, touched_table


def test_closed_form_limits_and_seed_values():
    assert expected_touched(384, 6, 0) == 0
    assert expected_touched(384, 6, 1) == pytest.approx(6)           # one token reads exactly k experts
    assert expected_touched(384, 384, 3) == 384                       # top-E touches everything
    assert expected_touched(384, 6, 10_000) == pytest.approx(384)
    # the published table (seed 000): 45.5, 243.8, 377.2 experts for B = 8, 64, 256
    assert [round(expected_touched(384, 6, b), 1) for b in (8, 64, 256)] == [45.5, 243.8, 377.2]
    rows = touched_table(384, 6, (1, 64))
    assert rows[1]["fraction"] == pytest.approx(243.845 / 384, abs=1e-4)


@pytest.mark.parametrize("n_experts, top_k, batch", [(384, 6, 1), (384, 6, 8), (384, 6, 64), (384, 6, 256),
                                                     (128, 3, 20), (7, 2, 3)])
def test_simulation_agrees_with_closed_form(n_experts, top_k, batch):
    """Tolerance: 4 standard errors of the simulated mean (plus 0.05 for the zero-variance cases)."""
    sim = simulate_touched(n_experts, top_k, batch, trials=100, seed=1)
    closed = expected_touched(n_experts, top_k, batch)
    assert abs(sim.mean - closed) <= 4 * sim.std_error + 0.05, (sim, closed)
    assert sim.mean <= min(n_experts, batch * top_k)


def test_simulation_is_seeded():
    a, b = simulate_touched(384, 6, 32, trials=20, seed=7), simulate_touched(384, 6, 32, trials=20, seed=7)
    c = simulate_touched(384, 6, 32, trials=20, seed=8)
    assert a == b and a.mean != c.mean


@pytest.mark.parametrize("call, message", [
    (lambda: expected_touched(384, 0, 4), "need 0 < top_k <= n_experts"),
    (lambda: expected_touched(4, 6, 4), "top_k=6, n_experts=4"),
    (lambda: expected_touched(384, 6, -1), "batch size must be non-negative"),
    (lambda: simulate_touched(384, 6, 4, trials=1), "at least 2 trials"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
