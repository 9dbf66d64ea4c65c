"""Cache exactness: cached decode, chunked prefill, multi-token decode, batched rows and rollback all
equal the one-shot forward (float64 so that top-k choices cannot flip on rounding)."""
import pytest
import torch

from tests.model_helpers import random_tokens, tiny_model

TOL = dict(atol=1e-9, rtol=1e-9)
N = 41   # > window (8) + margin, > index_topk (4) for both ratios, odd so ratio-2 groups straddle calls
SMALL_VOCAB = dict(vocab_size=2048, dspark_noise_token_id=2047)   # the head dominates otherwise


@pytest.fixture(scope="module")
def model():
    return tiny_model(**SMALL_VOCAB)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(2, N, seed=1, vocab=2048)


@pytest.fixture(scope="module")
def full(model, tokens):
    with torch.no_grad():
        return model(tokens, logits="all").logits


def run_chunks(model, tokens, sizes, cache=None):
    cache = cache or model.new_cache(tokens.size(0), 64)
    outs, at = [], 0
    with torch.no_grad():
        for n in sizes:
            outs.append(model(tokens[:, at:at + n], cache, logits="all").logits)
            at += n
    assert at == tokens.size(1)
    return torch.cat(outs, 1), cache


def test_cached_decode_equals_full_forward(model, tokens, full):
    got, cache = run_chunks(model, tokens, [1] * N)
    torch.testing.assert_close(got, full, **TOL)
    assert cache.pos.tolist() == [N, N]


@pytest.mark.parametrize("sizes", [[20, 21], [3, 17, 1, 20], [19, 22], [40, 1]])
def test_chunked_prefill_equals_one_shot(model, tokens, full, sizes):
    got, _ = run_chunks(model, tokens, sizes)
    torch.testing.assert_close(got, full, **TOL)


def test_multi_token_decode_equals_token_by_token(model, tokens, full):
    got, _ = run_chunks(model, tokens, [11, 6, 6, 5, 6, 1, 6])
    torch.testing.assert_close(got, full, **TOL)


def test_last_logits_are_the_last_row_of_all(model, tokens, full):
    with torch.no_grad():
        last = model(tokens).logits
    assert last.shape == (2, model.args.vocab_size)
    torch.testing.assert_close(last, full[:, -1], **TOL)


def test_rows_at_different_positions_equal_each_row_alone(model, tokens):
    a, b = tokens[0:1], tokens[1:2]
    with torch.no_grad():
        alone_a, alone_b = model(a, logits="all").logits, model(b, logits="all").logits
        cache = model.new_cache(3, 64)
        # row 2 gets 13 tokens of b, row 0 gets 6 tokens of a: different positions, then batched decode
        model(b[:, :13], cache, rows=[2])
        model(a[:, :6], cache, rows=[0])
        out_a, out_b = [], []
        for step in range(4):
            pa, pb = 6 + 3 * step, 13 + 3 * step
            both = torch.cat([a[:, pa:pa + 3], b[:, pb:pb + 3]])
            o = model(both, cache, rows=[0, 2], logits="all").logits
            out_a.append(o[0]), out_b.append(o[1])
    torch.testing.assert_close(torch.cat(out_a), alone_a[0, 6:18], **TOL)
    torch.testing.assert_close(torch.cat(out_b), alone_b[0, 13:25], **TOL)
    assert cache.pos.tolist() == [18, 0, 25]


def assert_same_live_state(c1, c2, row):
    s1, s2 = c1.live_state(row), c2.live_state(row)
    assert s1.keys() == s2.keys()
    kinds = {k.split(".")[0] for k in s1}
    assert {"window", "comp_kv", "index_k", "pending_kv", "pending_gate", "engram_history", "pos"} <= kinds
    for k in s1:
        assert torch.equal(s1[k], s2[k]), f"cache entry {k} differs after rollback"


@pytest.mark.parametrize("prefix,rejected", [(23, 6), (24, 5), (30, 11)])
def test_rollback_then_redecode_equals_never_having_decoded(model, tokens, prefix, rejected):
    other = random_tokens(2, rejected, seed=7, vocab=2048)
    with torch.no_grad():
        clean = model.new_cache(2, 64)
        model(tokens[:, :prefix], clean)
        ref = model(tokens[:, prefix:prefix + 6], clean, logits="all").logits

        rolled = model.new_cache(2, 64)
        model(tokens[:, :prefix], rolled)
        model(other, rolled)                       # a rejected draft block ...
        rolled.rollback(prefix)                    # ... taken back
        assert rolled.pos.tolist() == [prefix, prefix]
        again = model(tokens[:, prefix:prefix + 6], rolled, logits="all").logits
    assert torch.equal(again, ref)
    for row in range(2):
        assert_same_live_state(rolled, clean, row)
    # the compressed rows beyond the live range were cleared, so those tensors match whole
    for src in clean.comp_kv:
        assert torch.equal(rolled.comp_kv[src][:, :-1], clean.comp_kv[src][:, :-1])
        assert torch.equal(rolled.index_k[src][:, :-1], clean.index_k[src][:, :-1])
    assert torch.equal(rolled.engram_history, clean.engram_history)


def test_rollback_of_one_row_leaves_the_others(model, tokens):
    with torch.no_grad():
        cache = model.new_cache(2, 64)
        model(tokens[:, :20], cache)
        before = cache.live_state(1)
        cache.rollback(17, rows=[0])
    assert cache.pos.tolist() == [17, 20]
    after = cache.live_state(1)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_rollback_limits_are_clear_errors(model, tokens):
    with torch.no_grad():
        cache = model.new_cache(2, 64)
        model(tokens[:, :30], cache)
    with pytest.raises(ValueError, match="rollback_margin"):
        cache.rollback(30 - cache.margin - 1)
    with pytest.raises(ValueError, match="it is at 30"):
        cache.rollback(31)
    cache.rollback(30 - cache.margin)              # the documented limit itself works
    assert cache.margin >= 2 * (model.args.dspark_block_size + 1)


def test_sequence_longer_than_the_cache_names_the_limit(model, tokens):
    cache = model.new_cache(2, 16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(tokens[:, :17], cache)
    with torch.no_grad():
        model(tokens[:, :16], cache)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(tokens[:, 16:17], cache)


def test_bad_rows_and_tokens_are_rejected(model, tokens):
    cache = model.new_cache(2, 64)
    with pytest.raises(ValueError, match="repeat"):
        model(tokens, cache, rows=[1, 1])
    with pytest.raises(ValueError, match="outside"):
        model(tokens[:1], cache, rows=[5])
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[0, 2048]]))
    with pytest.raises(ValueError, match="empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
