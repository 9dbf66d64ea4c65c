"""What a token record keeps of its logits (engine.trace.token_logits): the chunked top-k against torch.topk, and the
log-probabilities against a plain log-softmax."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.trace.token_logits import CHUNK, CHUNKED_FROM, predicted, top_k

torch.set_num_threads(1)


def assert_like_topk(logits: torch.Tensor, k: int) -> None:
    """top_k's values equal torch.topk's in order, and each index points at its value (ties may list others)."""
    values, ids = top_k(logits, k)
    want = torch.topk(logits, k).values
    assert torch.equal(values, want)
    assert torch.equal(logits[ids], values)
    assert len(set(ids.tolist())) == k


@pytest.mark.parametrize("vocab", [CHUNKED_FROM, CHUNKED_FROM + 77, 129_280, 3_229, 7])
def test_top_k_matches_torch_topk(vocab):
    g = torch.Generator().manual_seed(vocab)
    for k in (1, 5, min(20, vocab)):
        assert_like_topk(torch.randn(vocab, generator=g), k)


def test_top_k_finds_the_largest_wherever_they_lie():
    """All the largest values in one chunk, in the tail past the last whole chunk, spread one per chunk, tied
    across chunks, or among -inf: the chunk maxima lead to them."""
    vocab = CHUNKED_FROM * 2 + 5                           # a tail of 5 past the last whole chunk
    cases = []
    x = torch.zeros(vocab)
    x[CHUNK * 3: CHUNK * 3 + 6] = torch.arange(6.0) + 1    # one chunk holds them all
    cases.append(x)
    x = torch.zeros(vocab)
    x[-5:] = torch.arange(5.0) + 1                         # the tail holds them
    cases.append(x)
    x = torch.zeros(vocab)
    x[::CHUNK] = torch.arange(len(x[::CHUNK]), dtype=torch.float32)   # one per chunk
    cases.append(x)
    x = torch.zeros(vocab)
    x[[3, CHUNK + 9, 5 * CHUNK + 1, vocab - 1]] = 2.0      # ties across chunks and the tail
    cases.append(x)
    x = torch.full((vocab,), float("-inf"))
    x[[17, vocab - 2]] = torch.tensor([1.0, 3.0])          # all but two masked out
    cases.append(x)
    for x in cases:
        for k in (1, 4, 5):
            assert_like_topk(x, k)
    values, ids = top_k(cases[0], 3)
    assert ids.tolist() == [CHUNK * 3 + 5, CHUNK * 3 + 4, CHUNK * 3 + 3]


def test_top_k_puts_nan_first_as_torch_topk_does():
    x = torch.randn(CHUNKED_FROM * 2)
    x[CHUNK * 7 + 3] = float("nan")
    values, ids = top_k(x, 3)
    assert math.isnan(values[0]) and ids[0] == CHUNK * 7 + 3
    assert torch.equal(values[1:], torch.topk(x, 3).values[1:])


@pytest.mark.parametrize("vocab", [3_229, 129_280])
def test_predicted_gives_the_log_probability_and_the_top_k(vocab):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(vocab, generator=g) * 4
    log_probs = torch.log_softmax(logits, -1)
    token = int(torch.topk(logits, 9).indices[-1])          # not among the top 5
    logprob, ids, top_logits, top_probs = predicted(logits, token, 5)
    assert logprob == pytest.approx(float(log_probs[token]), abs=1e-6)
    want = torch.topk(logits, 5)
    assert ids.dtype == np.int64 and top_logits.dtype == np.float32 and top_probs.dtype == np.float32
    assert ids.tolist() == want.indices.tolist() and np.array_equal(top_logits, want.values.numpy())
    np.testing.assert_allclose(top_probs, torch.softmax(logits, -1)[want.indices].numpy(), rtol=1e-6)
    bf16 = predicted(logits.bfloat16().view(1, -1), token, 5)                  # [1, V] bf16: read as fp32 [V]
    assert bf16[1].tolist() == torch.topk(logits.bfloat16().float(), 5).indices.tolist()


def test_predicted_without_the_token_or_top_k():
    logits = torch.randn(100)
    logprob, ids, top_logits, top_probs = predicted(logits, 100, 0)   # id outside the vocabulary, k = 0
    assert math.isnan(logprob) and ids.shape == top_logits.shape == top_probs.shape == (0,)
    assert predicted(logits, -1, 200)[1].shape == (100,)               # k past the vocabulary: all of it
