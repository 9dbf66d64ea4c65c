"""At T > 0, a run whose auto schedule mixes plain steps with drafting steps still emits tokens that follow the
target's distribution (the chi-square test of test_dspark_distribution, α = 0.001)."""
import pytest
import torch

from engine.dspark.fallback import PlainFallback
from engine.dspark.schedule import ThroughputTable
from engine.generation import DSparkConfig
from tests.dspark.test_dspark_distribution import ALPHA, N, chi_square_p, emitted, exact, model  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # the same chi-square test with the auto schedule's plain steps [15 s]

# a draft costs about ten plain steps at 1000 rows: each step's confidences decide between drafting and waiting
COSTLY = ThroughputTable([1, 1000, 1500, 3000], [100.0, 90.0, 50.0, 20.0], draft_rows=[1, 1000],
                         draft_seconds=[0.001, 0.1])


def test_sampled_tokens_with_plain_steps_follow_the_target_distribution(model, exact, monkeypatch):  # noqa: F811
    monkeypatch.setattr(PlainFallback, "WARMUP", 1)          # 4 new tokens: judge from the first drafting step on
    counts, res = emitted(model, dspark=DSparkConfig("auto", sps=COSTLY))
    assert res.plain_steps > 0 and res.steps                 # both kinds of step emitted tokens 2 and 3
    for c, probs in zip(counts, exact):
        assert chi_square_p(c, probs) > ALPHA, (c / N, probs)
    assert torch.tensor(res.tokens).shape == (N, 4)
