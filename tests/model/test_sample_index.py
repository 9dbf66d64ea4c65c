"""sample_index: one draw per call, distributed as the weights say (chi-square, α = 0.001), never an index of weight 0,
on one running sum (small vocabularies) and on block sums (large ones)."""
import pytest
import torch

from engine.model import sampling
from engine.model.sampling import ONE_PASS_MAX, SAMPLE_BLOCK, draw, sample_index
from engine.spec.errors import InputError
from tests.dspark.test_dspark_distribution import ALPHA, chi_square_p


def counts_of(weights: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    drawn = torch.cat([sample_index(weights, g) for _ in range(n)])
    assert drawn.dtype == torch.long and drawn.shape == (n,)
    return torch.bincount(drawn, minlength=weights.numel()).double()


def test_one_running_sum_follows_the_weights():
    weights = torch.softmax(torch.randn(300, generator=torch.Generator().manual_seed(1)) * 1.5, -1)
    weights[[0, 7, 299]] = 0.0                                   # zeros first, inside and last: never drawn
    counts = counts_of(weights, 30_000)
    assert counts[[0, 7, 299]].sum() == 0
    live = weights > 0
    assert chi_square_p(counts[live], weights[live] / weights.sum()) > ALPHA


def test_block_sums_follow_the_weights_across_blocks_and_the_tail():
    V = 3 * ONE_PASS_MAX + 77                                     # past one running sum, with a partial last block
    assert V % SAMPLE_BLOCK
    weights = torch.zeros(V)
    live = torch.tensor([0, SAMPLE_BLOCK - 1, SAMPLE_BLOCK, 5 * SAMPLE_BLOCK + 3, V // 2, V - 78, V - 77, V - 2])
    weights[live] = torch.tensor([3.0, 1.0, 2.0, 0.5, 4.0, 1.5, 2.5, 1.0])   # not normalised
    counts = counts_of(weights, 20_000)
    assert counts.sum() == counts[live].sum()                     # nothing outside the live indices
    assert chi_square_p(counts[live], weights[live] / weights.sum()) > ALPHA


def test_a_seeded_generator_repeats_its_draws_and_draw_takes_one_per_row():
    weights = torch.softmax(torch.randn(2, 50_000), -1)
    first = [int(sample_index(weights[0], torch.Generator().manual_seed(5))) for _ in range(3)]
    assert len(set(first)) == 1
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    rows = draw(weights, [g1, g2])
    assert rows.tolist() == [int(sample_index(weights[0], torch.Generator().manual_seed(1))),
                             int(sample_index(weights[1], torch.Generator().manual_seed(2)))]


def test_a_target_rounded_onto_the_last_sum_takes_the_last_weighted_index():
    running = torch.tensor([0.0, 0.25, 0.25, 1.0, 1.0, 1.0], dtype=torch.float64)   # weights 0, .25, 0, .75, 0, 0
    assert sampling._first_above(running, torch.tensor([1.0], dtype=torch.float64)) == 3
    assert sampling._first_above(running, torch.tensor([0.0], dtype=torch.float64)) == 1
    assert sampling._first_above(running, torch.tensor([0.25], dtype=torch.float64)) == 3


@pytest.mark.parametrize("V", [10, ONE_PASS_MAX + 1])
def test_weights_summing_to_zero_are_refused(V):
    with pytest.raises(InputError, match="sum to 0"):
        sample_index(torch.zeros(V), torch.Generator().manual_seed(0))
