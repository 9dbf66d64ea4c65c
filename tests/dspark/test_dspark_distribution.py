"""At T > 0, tokens emitted through DSpark verification follow the target's distribution (chi-square, α = 0.001)."""
import pytest
import torch

from engine.dspark.schedule import ThroughputTable
from engine.dspark.verify import Verdict, verify
from engine.generation import DSparkConfig, generate_speculative
from engine.request import GenerationRequest
from tests.model_helpers import tiny_model

pytestmark = pytest.mark.slow  # a chi-square test over 1000 sampled rows, and its power check [14 s]

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
        p1 = torch.softmax(model(torch.tensor([PROMPT])).logits[0].double(), -1)             # [V]
        p2 = torch.softmax(model(torch.tensor([PROMPT + [a] for a in range(V)])).logits.double(), -1)  # [V, V]
        pairs = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = torch.softmax(model(pairs).logits.double(), -1).view(V, V, V)                   # [a, b, c]
    return p1 @ p2, torch.einsum("a,ab,abc->c", p1, p2, p3)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square goodness of fit (V − 1 degrees of freedom), via the regularised
    upper incomplete gamma function: P(χ²_k > x) = Q(k/2, x/2)."""
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2, dtype=torch.float64), stat / 2))


def emitted(model, n=N, verifier=verify, **settings):
    request = GenerationRequest.of(4, temperature=1.0, seed=1000, stop_tokens=(), **settings)
    res = generate_speculative(model, [PROMPT] * n, request, verifier=verifier)
    toks = torch.tensor(res.tokens)                                                           # [N, 4]
    return [torch.bincount(toks[:, k], minlength=V).double() for k in (1, 2)], res


def accept_everything(drafts, q, p, generator=None):
    """A broken verifier: keeps every draft and adds the target's bonus token (emits the drafter's q)."""
    n = drafts.shape[0]
    return Verdict(accepted=n, token=int(torch.multinomial(p[n], 1, generator=generator)), bonus=True)


# Schedules decide from confidences, and c_k depends only on drafts before x_{k+1} (through the Markov embedding
# of the previous token): whether x_{k+1} is verified never depends on its own value, so every schedule here
# (the early-stopped Alg. 1 included) stays lossless; "threshold" and "auto" give rows different lengths.
STEEP = ThroughputTable([1, 1000, 1500, 3000], [100.0, 90.0, 50.0, 20.0])


@pytest.mark.parametrize("cfg", [DSparkConfig("all"), DSparkConfig("threshold", 0.04), DSparkConfig("auto", sps=STEEP)],
                         ids=["all", "threshold", "auto"])
def test_emitted_tokens_follow_the_target_distribution(model, exact, cfg):
    counts, res = emitted(model, dspark=cfg)
    m = res.metrics
    # both verification outcomes were exercised, and rows of one forward verified different lengths
    assert 0 < m.accepted < m.scheduled and m.bonus > 0 and m.calibration_n[0] > 100
    lengths = {s.verify_len for s in res.steps if s.step == 1}
    assert lengths == {2} if cfg.schedule == "all" else len(lengths) > 1   # "all": capped by the 4-token budget
    assert cfg.schedule == "auto" or m.calibration_n[1] > 100             # two-draft blocks too
    for c, probs in zip(counts, exact):
        assert chi_square_p(c, probs) > ALPHA, (c / N, probs)


def ruled(logits: torch.Tensor, history: list[int], rules: dict) -> torch.Tensor:
    """The rules written out for one history: the CTRL penalty on its tokens, or the ban of all of them (a no-repeat
    n-gram size of 1)."""
    out = logits.clone()
    for t in set(history):
        if "repetition_penalty" in rules:
            rho = rules["repetition_penalty"]
            out[t] = out[t] / rho if out[t] > 0 else out[t] * rho
        if rules.get("no_repeat_ngram") == 1:
            out[t] = float("-inf")
    return out


def exact_under(model, rules: dict):
    """The marginals of the 2nd and 3rd emitted token when plain sampling applies `rules` at every position."""
    with torch.inference_mode():
        p1 = torch.softmax(ruled(model(torch.tensor([PROMPT])).logits[0], PROMPT, rules).double(), -1)        # [V]
        l2 = model(torch.tensor([PROMPT + [a] for a in range(V)])).logits                                   # [V, V]
        p2 = torch.stack([torch.softmax(ruled(l2[a], PROMPT + [a], rules).double(), -1) for a in range(V)])
        l3 = model(torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])).logits              # [V², V]
        p3 = torch.stack([torch.softmax(ruled(l3[a * V + b], PROMPT + [a, b], rules).double(), -1)
                          for a in range(V) for b in range(V)]).view(V, V, V)
    return p1 @ p2, torch.einsum("a,ab,abc->c", p1, p2, p3)


@pytest.mark.parametrize("rules", [{"repetition_penalty": 1.8}, {"no_repeat_ngram": 1}], ids=["penalty", "no-repeat"])
def test_emitted_tokens_follow_the_target_distribution_under_history_rules(model, exact, rules):
    # the target's distribution at a verified position is processed with the drafts before it in the history
    counts, res = emitted(model, dspark=DSparkConfig("all"), **rules)
    m = res.metrics
    assert 0 < m.accepted < m.scheduled and m.bonus > 0
    for c, probs in zip(counts, exact_under(model, rules)):
        possible = probs > 0                     # a banned token (probability 0) must never be emitted
        assert not c[~possible].any(), (c, probs)
        assert chi_square_p(c[possible], probs[possible]) > ALPHA, (c / N, probs)
    # the rules move the distribution far enough that the test tells the two apart
    assert min(chi_square_p(c, probs) for c, probs in zip(counts, exact)) < ALPHA
    if rules.get("no_repeat_ngram") == 1:    # in every row: no token of the prompt or of its own output comes back
        assert all(len(set(t)) == len(t) and not set(t) & set(PROMPT) for t in res.tokens)


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
    # the subtle one needs more samples: at N its p-value is 0.002-0.007 over seeds, at 3N below 1e-17
    counts, _ = emitted(model, verifier=lossy, n=3 * N if lossy is resample_from_target else 300)
    assert min(chi_square_p(c, probs) for c, probs in zip(counts, exact)) < ALPHA


def test_chi_square_p_value_matches_known_quantiles():
    # 15 degrees of freedom: P(χ² > 37.697) = 0.001 and P(χ² > 14.339) = 0.5 (standard tables)
    probs = torch.full((16,), 1 / 16, dtype=torch.float64)
    assert chi_square_p(torch.tensor([64.0] * 16), probs) == pytest.approx(1.0)

    def stat(p):
        return float(torch.special.gammaincc(torch.tensor(7.5, dtype=torch.float64), torch.tensor(p / 2)))

    assert stat(37.697) == pytest.approx(1e-3, rel=1e-3) and stat(14.339) == pytest.approx(0.5, rel=1e-3)


def test_global_search_scheduler_is_refused_when_sampling(model):
    with pytest.raises(ValueError, match="not lossless at temperature > 0"):
        generate_speculative(model, [PROMPT],
                             GenerationRequest.of(2, temperature=1.0, dspark=DSparkConfig("auto", sps=STEEP,
                                                  early_stop=False)))
