"""Draft scheduling: survival products, threshold cut, DSpark Alg. 1 against brute force (the draft's cost
included), and the auto schedule's plain steps when drafting does not pay."""
import itertools

import pytest
import torch

from engine.dspark.calibration import OnlineCalibration
from engine.dspark.config import DSparkConfig
from engine.dspark.fallback import PlainFallback
from engine.dspark.schedule import (
    ThroughputTable,
    drafting_pays,
    schedule_all,
    schedule_block,
    schedule_threshold,
    schedule_throughput,
    step_gain,
    survival,
)


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


def test_a_fixed_width_block_verifies_every_draft_or_none():
    """Graphed blocks: every draft when the expected tokens, the anchors plus the drafts' survival (two rows here:
    2 + 1.575 + 0.7), reach one token per row times the block's cost in plain forwards; else none."""
    c = torch.tensor([[0.9, 0.5, 0.5], [0.5, 0.2, 1.0]])                # survival sums 1.575 and 0.7
    assert schedule_block(c, 2.0) == [3, 3]                              # 4.275 ≥ 4
    assert schedule_block(c, 2.2) == [0, 0]                              # 4.275 < 4.4
    assert schedule_block(c[:1], 2.5) == [3] and schedule_block(c[1:], 1.8) == [0]   # 2.575 ≥ 2.5; 1.7 < 1.8
    auto = DSparkConfig("auto", sps=ThroughputTable([1, 8], [100.0, 50.0], draft_rows=[1], draft_seconds=[0.01]))
    assert auto.lengths(c, least=1, block_over_plain=2.0) == [3, 3] and auto.lengths(c, 1, 2.2) == [0, 0]
    assert DSparkConfig("all").lengths(c, block_over_plain=9.0) == [3, 3]  # only auto chooses


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


COSTLY = ThroughputTable([1, 2, 6, 10], [100.0, 95.0, 80.0, 50.0], draft_rows=[1, 2], draft_seconds=[0.02, 0.024])


def expected_rate_with_draft(a, lengths, sps):
    n = len(lengths)
    expected = n + sum(float(a[r, :l].sum()) for r, l in enumerate(lengths))
    return expected / (sps.draft_cost(n) + 1 / sps(n + sum(lengths)))


@pytest.mark.parametrize("seed", range(6))
def test_global_search_with_the_draft_cost_equals_brute_force(seed):
    """The draft's seconds join every candidate's time: the exact search still finds the best prefixes."""
    c = torch.rand(2, 4, generator=torch.Generator().manual_seed(seed)) ** 0.5
    a = survival(c)
    lengths = schedule_throughput(c, COSTLY, early_stop=False)
    best = max(itertools.product(range(5), repeat=2), key=lambda ls: expected_rate_with_draft(a, ls, COSTLY))
    assert expected_rate_with_draft(a, lengths, COSTLY) == pytest.approx(expected_rate_with_draft(a, best, COSTLY))


def test_a_costly_draft_is_verified_further_and_judged_against_plain_steps():
    """With the draft's cost counted, each verified draft adds tokens to a step whose fixed cost is already paid,
    so the scheduler verifies further than with drafting free; drafting_pays compares the step's expected rate
    with plain decoding's (one token per forward of one token)."""
    c = torch.tensor([[0.9, 0.7, 0.5, 0.3]])
    free = ThroughputTable(COSTLY.batch_tokens, COSTLY.steps_per_second)
    assert schedule_throughput(c, free) == [3] and schedule_throughput(c, COSTLY) == [4]
    assert not drafting_pays(c, [4], COSTLY)          # 2.94 expected tokens in 0.02 + 1/83.75 s: 92 < 100 tokens/s
    assert drafting_pays(c, [2], free)                # free drafting never loses to plain steps
    sure = torch.tensor([[0.99, 0.99, 0.99, 0.99]])
    assert drafting_pays(sure, schedule_throughput(sure, COSTLY), COSTLY)   # 4.9 tokens in 0.032 s: 153 > 100 / s
    assert not drafting_pays(torch.zeros(1, 4), schedule_throughput(torch.zeros(1, 4), COSTLY), COSTLY)


def test_plain_fallback_waits_longer_after_each_look_that_does_not_pay():
    """The first WARMUP drafting steps always draft; then, while the running mean gain (half expected from the
    confidences, half delivered by the verdicts) stays below 1: 1 plain step, a draft to look, 2, 4, … up to
    MAX_WAIT; a look that lifts the mean above 1 resumes drafting (and the next fall waits 1 step again)."""
    fallback = PlainFallback(COSTLY)
    hopeless, sure = torch.zeros(1, 4), torch.full((1, 4), 0.99)
    assert step_gain(hopeless, [1], COSTLY) == pytest.approx(1 / (0.02 + 1 / 95) / 100)   # 1 token in 0.0305 s
    assert step_gain(sure, [4], COSTLY) > 1.5
    for _ in range(PlainFallback.WARMUP - 1):
        fallback.judge(hopeless, [1], [0])
        assert fallback.drafts()
    waits = []
    for _ in range(7):
        fallback.judge(hopeless, [1], [0])
        plain = 0
        while not fallback.drafts():
            plain += 1
        waits.append(plain)                      # then drafts() returned True: the next judge is that look's
    assert waits == [min(2 ** k, PlainFallback.MAX_WAIT) for k in range(7)] and waits[-1] == waits[-2]
    for looks in range(1, 4):  # noqa: B007 (read below) looks whose drafts pay: the mean climbs back over 1
        fallback.judge(sure, [4], [4])
        if fallback.gain >= 1:
            break
        assert not fallback.drafts()
        fallback.wait = 0
    assert looks <= 2 and fallback.drafts() and fallback.drafts()
    fallback.judge(hopeless, [1], [0])           # the mean falls below 1 again: wait 1 step
    assert fallback.gain < 1 and not fallback.drafts() and fallback.drafts()
    # the verdicts count as much as the confidences: sure drafts all rejected deliver one token in a costly step
    judged = PlainFallback(COSTLY)
    judged.judge(sure, [4], [0])
    delivered = 1 / (0.02 + 1 / 83.75) / 100
    assert judged.gain == pytest.approx(1 + PlainFallback.GAIN_WEIGHT * (0.5 * (step_gain(sure, [4], COSTLY)
                                                                                + delivered) - 1))


def test_plain_fallback_corrects_the_table_by_the_runs_own_step_times():
    """Drafting steps that take the table's time and plain steps that take twice theirs (the table was profiled
    when plain steps ran relatively faster): drafting is judged twice as good; until both kinds have run, the
    table stands."""
    fallback = PlainFallback(COSTLY)
    step_s = COSTLY.draft_cost(1) + 1 / COSTLY(5)
    fallback.judge(torch.full((1, 4), 0.5), [4], [2], step_s)
    assert fallback.correction() == 1.0
    fallback.plain_step(1, 2 / COSTLY(1))
    assert fallback.correction() == pytest.approx(2.0)
    for _ in range(20):                          # plain steps back at the table's speed: the running mean follows
        fallback.plain_step(1, 1 / COSTLY(1))
    assert fallback.correction() == pytest.approx(1.0, abs=1e-3)


def test_online_calibration_scales_confidences_towards_the_observed_acceptance():
    """Steps that verify drafts 1-2 at c = 0.5 and accept 3 in 4 of them: the calibrated c moves towards 0.75 as
    verdicts accumulate (PRIOR pseudo-steps hold it at the drafter's value at first), position 2, always accepted
    when reached, near 1, position 3, never verified, borrows the pooled ratio, and nothing exceeds 1."""
    cal = OnlineCalibration(3)
    c = torch.tensor([[0.5, 0.5, 0.5]])
    assert torch.equal(cal(c), c)                                 # no verdicts yet: the drafter as it is
    for i in range(400):
        cal.update(c, [2], [2 if i % 4 else 0])                   # accepted 2 (both kept) three times in four
    got = cal(c)[0]
    # position 1: 300 of 400 kept; position 2: reached 300 times, all kept (conditional acceptance 1.0)
    prior = OnlineCalibration.PRIOR
    pooled = (600 + prior) / (350 + prior)                        # observed over predicted, both positions
    assert got[0] == pytest.approx(0.5 * (300 + prior * pooled) / (200 + prior), rel=1e-6) and 0.74 < got[0] < 0.76
    assert got[1] == pytest.approx(0.5 * (300 + prior * pooled) / (150 + prior), rel=1e-6) and got[1] > 0.99
    assert got[2] == pytest.approx(0.5 * pooled, rel=1e-6)        # never verified: the pooled ratio
    assert float(cal(torch.tensor([[0.99, 0.9, 0.9]])).max()) <= 1.0


def test_a_least_length_starts_the_search_past_the_jump_to_a_multi_token_call():
    """A verify block's second token costs a jump (a multi-token call's overhead) and the next ones little: from
    nothing, the early-stopped search stops at the jump; started from one verified draft (least=1, as a drafting
    step with plain steps to fall back on does), it goes on to the flat part."""
    jump = ThroughputTable([1, 2, 6], [100.0, 60.0, 56.0])
    c = torch.tensor([[0.6, 0.9, 0.9, 0.9, 0.9]])
    assert schedule_throughput(c, jump) == [0]                    # 1.6 tokens × 60 < 1 × 100
    assert schedule_throughput(c, jump, least=1) == [5]           # 1 + 0.6 + 0.54 + … = 3.46 tokens × 56 = 194
    assert schedule_throughput(torch.zeros(2, 5), jump, least=1) == [1, 1]
