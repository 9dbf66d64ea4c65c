"""At T > 0, tokens emitted through DSpark verification follow the target's distribution (chi-square, α = 0.001)."""
import pytest
import torch
from model_helpers import tiny_model

from engine.dspark.speculative import generate_speculative
from engine.dspark.verify import Verdict

V = 16                   # a tiny vocabulary: exact marginals by enumeration, many samples per bin
PROMPT = [0, 5, 7, 9]
N = 1000                 # independent samples: one batch row per seed
ALPHA = 1e-3             # significance level of every chi-square test below


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1)


@pytest.fixture(scope="module")
def exact(model):
    """Exact marginals of the 2nd and 3rd emitted token under plain sampling from the target at T = 1."""
    with torch.inference_mode():
        p1 = torch.softmax(model(torch.tensor([PROMPT]))[0].double(), -1)                    # [V]
        p2 = torch.softmax(model(torch.tensor([PROMPT + [a] for a in range(V)])).double(), -1)  # [V, V]
        pairs = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = torch.softmax(model(pairs).double(), -1).view(V, V, V)                          # [a, b, c]
    return p1 @ p2, torch.einsum("a,ab,abc->c", p1, p2, p3)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square goodness of fit (V − 1 degrees of freedom), via the regularised
    upper incomplete gamma function: P(χ²_k > x) = Q(k/2, x/2)."""
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2, dtype=torch.float64), stat / 2))


def emitted(model, **kw):
    res = generate_speculative(model, [PROMPT] * N, max_new_tokens=4, temperature=1.0, seed=1000, stop_tokens=(),
                               **kw)
    toks = torch.tensor(res.tokens)                                                           # [N, 4]
    return [torch.bincount(toks[:, k], minlength=V).double() for k in (1, 2)], res


def accept_everything(drafts, q, p, generator=None):
    """A broken verifier: keeps every draft and adds the target's bonus token (emits the drafter's q)."""
    n = drafts.shape[0]
    return Verdict(accepted=n, token=int(torch.multinomial(p[n], 1, generator=generator)), bonus=True)


def test_emitted_tokens_follow_the_target_distribution(model, exact):
    counts, res = emitted(model)
    m = res.metrics
    # both verification outcomes were exercised, including two-draft blocks
    assert 0 < m.accepted < m.scheduled and m.bonus > 0 and m.calibration_n[1] > 100
    for c, probs in zip(counts, exact):
        assert chi_square_p(c, probs) > ALPHA, (c / N, probs)


def resample_from_target(drafts, q, p, generator=None):
    """A subtly broken verifier: on rejection it samples from p instead of the residual max(p − q, 0)."""
    n = drafts.shape[0]
    u = torch.rand(n, generator=generator)
    for i in range(n):
        if u[i] >= min(1.0, float(p[i, drafts[i]] / q[i, drafts[i]].clamp_min(1e-8))):
            return Verdict(accepted=i, token=int(torch.multinomial(p[i], 1, generator=generator)), bonus=False)
    return Verdict(accepted=n, token=int(torch.multinomial(p[n], 1, generator=generator)), bonus=True)


@pytest.mark.parametrize("lossy", [accept_everything, resample_from_target])
def test_the_distribution_check_detects_a_lossy_verifier(model, exact, lossy):
    counts, _ = emitted(model, verifier=lossy)
    assert min(chi_square_p(c, probs) for c, probs in zip(counts, exact)) < ALPHA


def test_chi_square_p_value_matches_known_quantiles():
    # 15 degrees of freedom: P(χ² > 37.697) = 0.001 and P(χ² > 14.339) = 0.5 (standard tables)
    probs = torch.full((16,), 1 / 16, dtype=torch.float64)
    assert chi_square_p(torch.tensor([64.0] * 16), probs) == pytest.approx(1.0)
    stat = lambda p: float(torch.special.gammaincc(torch.tensor(7.5, dtype=torch.float64), torch.tensor(p / 2)))
    assert stat(37.697) == pytest.approx(1e-3, rel=1e-3) and stat(14.339) == pytest.approx(0.5, rel=1e-3)
