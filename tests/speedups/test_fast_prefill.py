"""The prefill speed paths: the threshold top-k picks what the stable sort picks, and a long prefill through the
fast indexer (query blocks cut to what they can see) and the C++ seams equals the reference's."""
import pytest
import torch

from engine.model import EngineOptions, Transformer, init_weights
from engine.model.indexer import select_candidate_blocks, stable_topk
from engine.speedups import apply_speedups
from engine.speedups.fast_topk import ascending_topk, candidate_blocks, topk_mask
from tests.model_helpers import RecordingTrace, random_tokens, synthetic_token_map, tiny_args


def tied_scores(seed: int) -> torch.Tensor:
    """[2, 7, 40] scores with many ties: a few values, and −inf tails (queries that see fewer rows than k)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (2, 7, 40), generator=g).double()
    visible = torch.randint(0, 41, (2, 7, 1), generator=g)
    return scores.masked_fill(torch.arange(40) >= visible, float("-inf"))


@pytest.mark.parametrize("k", [1, 4, 9])
def test_threshold_topk_picks_what_the_stable_sort_picks(k):
    for seed in range(5):
        scores = tied_scores(seed)
        assert torch.equal(ascending_topk(scores, k), stable_topk(scores, k).sort(-1).values)
        visible = (scores > float("-inf")).sum(-1)
        assert torch.equal(candidate_blocks(scores, visible, 3, 4), select_candidate_blocks(scores, visible, 3, 4))


def test_a_nan_row_falls_back_to_the_sort():
    scores = tied_scores(0)
    scores[1, 2, 5] = float("nan")
    assert topk_mask(scores, 4) is None
    assert torch.equal(ascending_topk(scores, 4), stable_topk(scores, 4).sort(-1).values)


@pytest.mark.slow  # two float64 tiny models through a 41-token prefill [~2.5 s]
def test_long_prefill_equals_the_reference():
    """A 40-token prefill in query blocks of 16 (so blocks see fewer rows than the call) and then a decode step:
    every layer's index list equal, logits equal up to float rounding."""
    a = tiny_args(vocab_size=2048, dspark_noise_token_id=2047)
    models = []
    for _ in range(2):
        m = Transformer(a, synthetic_token_map(a), dtype=torch.float64, options=EngineOptions(attn_query_block=16))
        init_weights(m, 0)
        models.append(m.eval())
    ref, fast = models[0], apply_speedups(models[1])
    toks = random_tokens(1, 41, seed=5, vocab=2048)
    out, traces = {}, {}
    with torch.inference_mode():
        for name, m in (("ref", ref), ("fast", fast)):
            cache, traces[name] = m.new_cache(1, 48), RecordingTrace()
            prefill = m(toks[:, :40], cache, logits="all", trace=traces[name]).logits
            out[name] = torch.cat([prefill[0], m(toks[:, 40:], cache, trace=traces[name]).logits])
    torch.testing.assert_close(out["fast"], out["ref"], atol=1e-9, rtol=1e-9)
    assert len(traces["fast"].attn) == len(traces["ref"].attn)
    for f, r in zip(traces["fast"].attn, traces["ref"].attn, strict=True):
        assert torch.equal(f["topk"], r["topk"]), f["path"]


def test_a_calls_query_blocks_score_into_one_buffer(monkeypatch):
    """Every query block of one indexer call writes its scores into the same memory (fast_indexer.ScoreScratch),
    so a long prefill's blocks, each wider than the last, leave no freed buffers of odd sizes for the heap to keep;
    each block's scores equal those scored into buffers of their own."""
    from engine.speedups import fast_indexer
    blocks = []
    score = fast_indexer.scores_in_place

    def spy(q, w, keys, visible, scratch=None):
        out = score(q, w, keys, visible, scratch)
        assert scratch is not None and torch.equal(out, score(q, w, keys, visible))
        blocks.append((scratch, out.data_ptr()))       # (each scratch kept alive: its id stays its own)
        return out

    monkeypatch.setattr(fast_indexer, "scores_in_place", spy)
    a = tiny_args(vocab_size=2048, dspark_noise_token_id=2047)
    model = Transformer(a, synthetic_token_map(a), options=EngineOptions(attn_query_block=16))
    init_weights(model, 0)
    model = apply_speedups(model.eval())
    with torch.inference_mode():
        model(random_tokens(1, 40, seed=5, vocab=2048), model.new_cache(1, 48))
    calls: dict[int, set[int]] = {}
    for scratch, pointer in blocks:
        calls.setdefault(id(scratch), set()).add(pointer)
    assert len(blocks) > len(calls) > 0                       # calls of several blocks
    assert all(len(pointers) == 1 for pointers in calls.values())
