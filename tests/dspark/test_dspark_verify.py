"""Lossless verification: greedy reduces to argmax matching; sampling preserves the target distribution."""
import math

import pytest
import torch

from engine.dspark.verify import distribution, verify


def test_greedy_accepts_while_draft_equals_target_argmax():
    V = 7
    target = torch.tensor([3, 5, 1, 6])                       # argmax of p at each of the 4 positions
    p = distribution(torch.nn.functional.one_hot(target, V).float() * 4, 0.0)
    drafts = torch.tensor([3, 5, 2])
    q = distribution(torch.randn(3, V), 0.0)
    v = verify(drafts, q, p)
    assert (v.accepted, v.token, v.bonus) == (2, 1, False)   # third draft 2 != target 1: replaced by 1
    v = verify(torch.tensor([3, 5, 1]), q, p)
    assert (v.accepted, v.token, v.bonus) == (3, 6, True)    # all kept, bonus = target's next argmax
    v = verify(torch.tensor([0, 5, 1]), q, p)
    assert (v.accepted, v.token) == (0, 3)


def test_verify_rejects_mismatched_shapes():
    try:
        verify(torch.tensor([1, 2]), torch.rand(2, 4), torch.rand(2, 4))
    except ValueError as e:
        assert "p [3, V]" in str(e)
    else:
        raise AssertionError("shape mismatch accepted")


def chi2_critical(df: int, z: float = 3.0902) -> float:
    """Upper 0.999 quantile of chi-square (Wilson-Hilferty; z = standard normal 0.999 quantile)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.slow  # thousands of sampled verifications [6 s]
def test_sampling_preserves_target_distribution():
    """Emit two tokens by draft+verify steps; their joint law must be p0 ⊗ p1 (chi-square, alpha = 0.001)."""
    g = torch.Generator().manual_seed(1234)
    V, gamma, trials = 5, 3, 12000
    p = torch.softmax(torch.randn(8, V, generator=g) * 1.5, -1)   # target law at absolute positions 0..7
    q = torch.softmax(torch.randn(8, V, generator=g) * 1.5, -1)   # a deliberately different draft law
    counts = torch.zeros(V, V)
    for _ in range(trials):
        out: list[int] = []
        while len(out) < 2:
            pos = len(out)
            drafts = torch.stack([torch.multinomial(q[pos + i], 1, generator=g)[0] for i in range(gamma)])
            v = verify(drafts, q[pos:pos + gamma], p[pos:pos + gamma + 1], generator=g)
            out += drafts[: v.accepted].tolist() + [v.token]
        counts[out[0], out[1]] += 1
    expected = trials * (p[0][:, None] * p[1][None, :])
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(V * V - 1), f"chi-square {stat:.1f} over {V * V - 1} df"
    # The same test must be able to fail: drafts taken without verification follow q, not p.
    naive = torch.zeros(V, V)
    for _ in range(trials // 4):
        naive[torch.multinomial(q[0], 1, generator=g)[0], torch.multinomial(q[1], 1, generator=g)[0]] += 1
    expected_naive = trials // 4 * (p[0][:, None] * p[1][None, :])
    assert float(((naive - expected_naive) ** 2 / expected_naive).sum()) > chi2_critical(V * V - 1)


def test_identical_draft_and_target_always_accept():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)
    for _ in range(50):
        drafts = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(3)])
        assert verify(drafts, p[:3], p, generator=g).accepted == 3


def test_greedy_shortcut_equals_verify_with_one_hot_distributions():
    from engine.dspark.verify import verify_greedy
    g = torch.Generator().manual_seed(0)
    V = 5
    for _ in range(200):
        n = int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(n + 1, V, generator=g)
        target = logits.argmax(-1)
        drafts = torch.where(torch.rand(n, generator=g) < 0.7, target[:n], torch.randint(0, V, (n,), generator=g))
        q = distribution(torch.nn.functional.one_hot(drafts, V).float(), 0.0)
        assert verify_greedy(drafts, target) == verify(drafts, q, distribution(logits, 0.0), generator=g)
    try:
        verify_greedy(torch.tensor([1, 2]), torch.tensor([1, 2]))
    except ValueError as e:
        assert "target_ids [3]" in str(e)
    else:
        raise AssertionError("shape mismatch accepted")
