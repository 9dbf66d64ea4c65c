"""What a token record keeps of its logits (engine.trace.token_logits): the chunked top-k against torch.topk, and the
log-probabilities against a plain log-softmax, row by row and held in a PendingLogits block until read."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.trace import pending_logits
from engine.trace.pending_logits import PendingLogits
from engine.trace.records import TokenRecord
from engine.trace.token_logits import CHUNK, CHUNKED_FROM, predicted_rows, top_k

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


def test_top_k_of_many_rows_is_each_rows_top_k():
    """Rows [N, V] (and [A, B, V]) at once: each row's values as torch.topk finds them, indices pointing at them."""
    g = torch.Generator().manual_seed(3)
    for vocab in (3_229, CHUNKED_FROM + 77, 129_280):
        x = torch.randn(6, vocab, generator=g)
        x[2, -1] = 50.0                                      # one row's largest in the tail (or the last chunk)
        x[4, CHUNK * 5: CHUNK * 5 + 7] = 40.0                # another's tied, all in one chunk
        for k in (1, 7):
            values, ids = top_k(x, k)
            assert values.shape == ids.shape == (6, k)
            assert torch.equal(values, torch.topk(x, k).values)
            assert torch.equal(x.gather(-1, ids), values)
            assert all(len(set(r)) == k for r in ids.tolist())
        values, ids = top_k(x.view(2, 3, vocab), 4)
        assert torch.equal(values, torch.topk(x, 4).values.view(2, 3, 4))
        assert torch.equal(x.view(2, 3, vocab).gather(-1, ids), values)


@pytest.mark.parametrize("vocab", [3_229, 129_280])
def test_predicted_rows_give_the_log_probabilities_and_the_top_k(vocab):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, vocab, generator=g) * 4
    log_probs = torch.log_softmax(logits, -1)
    tokens = [int(torch.topk(row, 9).indices[-1]) for row in logits]      # not among the top 5
    logprob, ids, top_logits, top_probs = predicted_rows(logits, tokens, 5)
    assert logprob.dtype == np.float64 and ids.dtype == np.int64
    assert top_logits.dtype == np.float32 and top_probs.dtype == np.float32
    for i, row in enumerate(logits):
        assert logprob[i] == pytest.approx(float(log_probs[i, tokens[i]]), abs=1e-6)
        want = torch.topk(row, 5)
        assert ids[i].tolist() == want.indices.tolist() and np.array_equal(top_logits[i], want.values.numpy())
        np.testing.assert_allclose(top_probs[i], torch.softmax(row, -1)[want.indices].numpy(), rtol=1e-6)
    bf16 = predicted_rows(logits.bfloat16(), tokens, 5)                    # bf16 rows: read as fp32
    assert bf16[1].tolist() == torch.topk(logits.bfloat16().float(), 5).indices.tolist()


def test_predicted_rows_without_the_token_or_top_k():
    logits = torch.randn(2, 100)
    logprob, ids, top_logits, top_probs = predicted_rows(logits, [100, -1], 0)   # ids outside the vocabulary, k = 0
    assert np.isnan(logprob).all() and ids.shape == top_logits.shape == top_probs.shape == (2, 0)
    assert predicted_rows(logits, [3, 4], 200)[1].shape == (2, 100)               # k past the vocabulary: all of it


def test_pending_logits_resolve_in_blocks_of_bounded_size(monkeypatch):
    """Rows wait in one block of PENDING_BYTES; a full block is resolved and reused, a read resolves the rest and
    lets the block go, a row of another width or device starts a new block; every record ends as predicted_rows
    makes it from its own logits."""
    monkeypatch.setattr(pending_logits, "PENDING_BYTES", 3 * 4 * 50)        # 3 rows of 50 logits (or of 40)
    g = torch.Generator().manual_seed(5)
    pending, made = PendingLogits(), []
    for i in range(7):
        vocab = 50 if i < 5 else 40
        logits = torch.randn(vocab, generator=g, dtype=torch.float64)
        rec = TokenRecord(0, i, i % vocab, "", True, i)
        pending.add(rec, logits if i % 2 else logits.view(1, -1), k=4)
        made.append((rec, logits))
        held = {0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 1, 6: 2}[i]                   # full at 3 rows, a new width at 5
        assert len(pending.records) == held and pending.block.shape == (3, vocab)
    assert math.isnan(made[6][0].logprob)                                     # not resolved yet
    pending.resolve(4)
    assert pending.block is None and not pending.records
    for rec, logits in made:
        want = predicted_rows(logits.float().view(1, -1), [rec.token_id], 4)
        assert rec.logprob == float(want[0][0])
        assert np.array_equal(rec.top_ids, want[1][0]) and np.array_equal(rec.top_logits, want[2][0])
        assert np.array_equal(rec.top_probs, want[3][0])
