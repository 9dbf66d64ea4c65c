"""Generation: sampling semantics (greedy, exact top-k/top-p masks, seeds), stop tokens, batching, streaming, traces."""
from __future__ import annotations

import pytest
import torch

from engine.sampling import SamplingParams, filter_logits, make_generators, probabilities, sample


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


def test_greedy_is_argmax_whatever_the_cuts():
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 1.0, 1.0, 0.0]])
    for p in (SamplingParams(), SamplingParams(0.0, top_k=1, top_p=0.1)):
        assert sample(logits, p, [None, None]).tolist() == [1, 0]
    assert probabilities(logits, SamplingParams())[0].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_k_keeps_exactly_the_k_largest_and_boundary_ties():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0, -1.0]])
    assert kept(filter_logits(logits, top_k=3)) == {1, 2, 3}
    assert kept(filter_logits(logits, top_k=1)) == {1}
    assert kept(filter_logits(logits, top_k=0)) == set(range(6))
    assert kept(filter_logits(logits, top_k=99)) == set(range(6))
    tied = torch.tensor([[2.0, 1.0, 2.0, 0.0]])
    assert kept(filter_logits(tied, top_k=1)) == {0, 2}
    # surviving logits are unchanged
    assert filter_logits(logits, top_k=3)[0, 1] == 5.0


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]])  # sorted: 1 (0.5), 3 (0.25), then 0 and 2
    logits = probs.log()
    assert kept(filter_logits(logits, top_p=0.4)) == {1}          # 0.5 already reaches 0.4
    assert kept(filter_logits(logits, top_p=0.6)) == {1, 3}       # 0.5 < 0.6 → 0.75
    k = kept(filter_logits(logits, top_p=0.8))                    # 0.75 < 0.8 → one of the tied 0.125s
    assert len(k) == 3 and {1, 3} < k
    assert kept(filter_logits(logits, top_p=1.0)) == {0, 1, 2, 3}
    # top-k is applied before top-p: after k=2 the nucleus is computed on the renormalised pair
    assert kept(filter_logits(logits, top_k=2, top_p=0.6)) == {1}  # 0.5/0.75 = 0.67 >= 0.6


def test_sampling_draws_only_allowed_tokens_with_the_right_frequencies():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).log_softmax(-1)
    params = SamplingParams(temperature=1.0, top_k=3)
    gen = make_generators([7], "cpu")
    draws = torch.stack([sample(logits, params, gen) for _ in range(4000)]).flatten()
    counts = torch.bincount(draws, minlength=5).float()
    assert counts[2] == counts[3] == 0
    expected = probabilities(logits, params)[0] * 4000
    # each count within 5 standard deviations of its binomial expectation
    sd = (expected * (1 - expected / 4000)).sqrt()
    assert torch.all((counts - expected).abs() <= 5 * sd + 1e-6), (counts, expected)


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = probabilities(logits, SamplingParams(temperature=0.5))[0]
    hot = probabilities(logits, SamplingParams(temperature=2.0))[0]
    torch.testing.assert_close(cold, torch.softmax(logits[0] / 0.5, -1))
    assert cold[0] > torch.softmax(logits[0], -1)[0] > hot[0]


def test_seeds_reproduce_and_differ():
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0)

    def draw(seeds):
        gens = make_generators(seeds, "cpu")
        return torch.stack([sample(logits, params, gens) for _ in range(20)]).tolist()

    assert draw([1, 2]) == draw([1, 2])
    assert draw([1, 2]) != draw([3, 4])
    # a row's draws depend only on its own seed
    assert [r[0] for r in draw([1, 2])] == [r[0] for r in draw([1, 9])]


def test_bad_parameters_are_named():
    for kwargs, word in (({"temperature": -1}, "temperature"), ({"top_k": -2}, "top_k"),
                         ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                         ({"temperature": float("nan")}, "temperature")):
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample(torch.zeros(5), SamplingParams(1.0), [None])
