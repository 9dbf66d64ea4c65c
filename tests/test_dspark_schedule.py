"""Draft scheduling: survival products, threshold cut, and DSpark Alg. 1 against brute force."""
import itertools

import pytest
import torch

from engine.dspark.schedule import ThroughputTable, schedule_all, schedule_threshold, schedule_throughput, survival


def test_survival_is_non_increasing_products():
    c = torch.tensor([[0.9, 0.8, 1.0, 0.5], [0.2, 0.9, 0.9, 0.9]])
    a = survival(c)
    assert torch.allclose(a[0], torch.tensor([0.9, 0.72, 0.72, 0.36]))
    assert bool((a[:, 1:] <= a[:, :-1]).all())


def test_all_and_threshold():
    c = torch.tensor([[0.9, 0.8, 0.3, 0.9], [0.95, 0.95, 0.95, 0.95], [0.1, 0.9, 0.9, 0.9]])
    assert schedule_all(c) == [4, 4, 4]
    assert schedule_threshold(c, 0.5) == [2, 4, 0]
    assert schedule_threshold(c, 0.0) == [4, 4, 4]


def expected_rate(a, lengths, sps):
    tokens = len(lengths) + sum(lengths)
    return (len(lengths) + sum(float(a[r, :l].sum()) for r, l in enumerate(lengths))) * sps(tokens)


def brute_force(c, sps):
    a = survival(c)
    best = max(itertools.product(range(c.shape[1] + 1), repeat=c.shape[0]),
               key=lambda ls: expected_rate(a, ls, sps))
    return expected_rate(a, best, sps)


@pytest.mark.parametrize("seed", range(12))
def test_global_search_equals_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(3, 4, generator=g) ** 0.5
    sps = ThroughputTable([1, 3, 6, 9, 15], [100.0, 98.0, 90.0, 70.0, 40.0])
    lengths = schedule_throughput(c, sps, early_stop=False)
    assert len(lengths) == 3 and all(0 <= l <= 4 for l in lengths)      # one prefix per request
    assert expected_rate(survival(c), lengths, sps) == pytest.approx(brute_force(c, sps), rel=1e-9)


def test_early_stop_ends_at_first_non_improving_pair():
    c = torch.tensor([[0.99, 0.99, 0.99, 0.99], [0.2, 0.9, 0.9, 0.9]])
    flat = ThroughputTable([1, 100], [50.0, 50.0])                   # free verification: take every draft
    assert schedule_throughput(c, flat) == [4, 4]
    steep = ThroughputTable([1, 2, 3, 10], [100.0, 100.0, 60.0, 10.0])  # the third batch token already costs 40%
    assert schedule_throughput(c, steep) == [0, 0]
    # With a gentle slope the confident request drafts far and the unsure one stays at its anchor.
    # (B=6 gives 5.90 expected tokens x 90 steps/s = 531; a 7th token would give 6.10 x 82.5 = 503.)
    knee = ThroughputTable([1, 2, 6, 10], [100.0, 100.0, 90.0, 60.0])
    assert schedule_throughput(c, knee) == [4, 0]
    # Without early stop the search looks past a dip: here the optimum is [4, 4] on a table that recovers.
    dip = ThroughputTable([1, 2, 3, 10], [100.0, 100.0, 60.0, 100.0])
    assert schedule_throughput(c, dip, early_stop=True) == [0, 0]
    assert schedule_throughput(c, dip, early_stop=False) == [4, 4]


def test_throughput_table_validation_and_interpolation():
    t = ThroughputTable([1, 5], [10.0, 2.0])
    assert t(3) == pytest.approx(6.0) and t(0) == 10.0 and t(50) == 2.0
    with pytest.raises(ValueError, match="increasing"):
        ThroughputTable([5, 1], [1.0, 2.0])
