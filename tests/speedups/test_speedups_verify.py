"""The speed paths of a DSpark step against the reference model: verify-shaped calls (2..6 tokens after a prefill,
rolled back as DSpark rolls them back), the drafter's block forward, the by-expert MoE pairs and the few-row head;
same logits, drafts and trace records in float64 and fp32, V4.1 and V4."""
from __future__ import annotations

import functools

import pytest
import torch

from engine.dspark.drafter import draft
from engine.dspark.drafter_cache import DrafterCache
from engine.model.moe import MoE
from engine.request.sampling import SamplingParams
from engine.speedups.fast_draft import FastDraftAttention, FastMarkovHead
from engine.speedups.fast_moe import FastMoE
from tests.model_helpers import RecordingTrace
from tests.speedups.test_speedups_fast import TOL, V, assert_same_trace, pair

# (tokens in the call, position to roll back to afterwards or None): verify blocks of every width DSpark sends,
# each rolled back to a kept prefix as a rejected draft is, the window ring wrapping and compressed groups closing
# inside blocks; a single-token decode step between them
CALLS = [(6, 14), (2, None), (5, 17), (1, None), (3, 19), (4, None), (6, 24)]


@functools.lru_cache(maxsize=4)
def models(family: str, dtype) -> tuple:
    """(reference, fast) with the same weights, built once for the tests below (which only run inference)."""
    return pair(family, dtype)


def verify_calls(model, tokens: torch.Tensor, prompt: int):
    """Prefill `prompt` tokens, then the CALLS, each reading the next tokens from position cache.pos → (logits of
    every call [n, V], the trace)."""
    trace = RecordingTrace(attention=True)
    cache = model.new_cache(1, tokens.size(1) + 8)
    out = []
    with torch.inference_mode():
        model(tokens[:, :prompt], cache, trace=trace)
        for width, back in CALLS:
            start = int(cache.pos[0])
            out.append(model(tokens[:, start:start + width], cache, trace=trace, logits="all").logits[0])
            if back is not None:  # every call's records stay: both models make the same calls
                cache.rollback(back, torch.tensor([0]))
    return torch.cat(out), trace


@pytest.mark.parametrize("family", ["v4.1", "v4"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_verify_blocks_equal_the_reference(family, dtype):
    """Every verify width from a 12-token prompt on (the window of 8 wraps, ratio-2 and ratio-4 groups close
    inside blocks, the indexer scores once the visible rows pass index_topk): logits, routing, mHC, Engram and
    attention facts as the reference records them."""
    ref, fast = models(family, dtype)
    tokens = torch.randint(3, V, (1, 48), generator=torch.Generator().manual_seed(11))
    (lr, tr), (lf, tf) = verify_calls(ref, tokens, 12), verify_calls(fast, tokens, 12)
    torch.testing.assert_close(lf, lr, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(lf.argmax(-1), lr.argmax(-1))
    assert_same_trace(tr, tf, TOL[dtype] if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("family", ["v4.1", "v4"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_fast_drafter_equals_the_reference(family, dtype):
    """The drafter's stages (FastDraftAttention over the ring and block, the few-token seams and MoE) and heads
    (the few-row vocabulary head, FastMarkovHead): the same greedy drafts and confidences from rings filled by each
    model's own taps (FastDraftAttention.ring_kv), for two rows at different positions (one before its ring is
    full)."""
    ref, fast = models(family, dtype)
    assert any(isinstance(m, FastDraftAttention) for m in fast.mtp.modules())
    assert isinstance(fast.mtp[-1].markov_head, FastMarkovHead)
    tokens = torch.randint(3, V, (2, 14), generator=torch.Generator().manual_seed(12))
    drafts = []
    for model in (ref, fast):
        cache = model.new_cache(2, 24)
        rings = DrafterCache(model, 2, cache.margin)
        with torch.inference_mode():
            for chunk in (tokens[:, :8], tokens[:, 8:]):   # 16 and 12 positions: the fast ring_kv (≤ 16) each time
                _, taps = model(chunk, cache, logits="last")
                rings.append(model, taps, [0, 1])
            rings.rollback(torch.tensor([14, 5]), torch.tensor([0, 1]))       # row 1: 5 positions, the ring not full
            drafts.append(draft(model, rings, torch.tensor([0, 1]), tokens[:, 5], SamplingParams(), [None, None]))
    want, got = drafts
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.confidence_logits, want.confidence_logits, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("n_tokens", [1, 2, 3, 5, 8, 11, 64, 200])
def test_moe_pairs_by_expert_equal_the_reference(n_tokens):
    """FastMoE's by-expert pairs (sorted_pairs, taken on the CPU up to twice the experts in pairs, and in a small
    model where the dense path's products for unchosen experts would cost more than the loop: 200 tokens here, not
    64), the dense path, the gathered pairs and the reference MoE give the same output and routing, routed experts
    shared between tokens included."""
    ref, fast = models("v4.1", torch.float64)
    moe_ref = next(m for m in ref.layers.modules() if type(m) is MoE and not m.hash_routed)
    moe_fast = next(m for m in fast.layers.modules() if type(m) is FastMoE and not m.hash_routed)
    x = torch.randn(1, n_tokens, ref.args.dim, generator=torch.Generator().manual_seed(n_tokens), dtype=torch.float64)
    with torch.inference_mode():
        want, (w_ref, ids_ref, _) = moe_ref(x)
        got, (w_fast, ids_fast, _) = moe_fast(x)
        pick = torch.nn.functional.pad(ids_fast, (0, 1), value=moe_fast.n_experts).view(-1)
        pair_w = torch.nn.functional.pad(w_fast, (0, 1), value=1.0).view(-1, 1)
        gathered = moe_fast.gathered_pairs(x.view(n_tokens, -1), pair_w, pick, n_tokens)
    assert torch.equal(ids_fast, ids_ref)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(gathered.view_as(want), want, atol=1e-12, rtol=0)
    if n_tokens in (64, 200):   # past the pairs rule: the dense path at 64 tokens, by expert at 200
        assert moe_fast.runs_densely() and moe_fast.sorts(n_tokens) == (n_tokens == 200)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 9])
def test_few_row_head_equals_the_reference(rows, dtype):
    ref, fast = models("v4.1", dtype)
    x = torch.randn(1, rows, ref.args.dim, generator=torch.Generator().manual_seed(rows)).to(dtype)
    with torch.inference_mode():
        want, got = ref.vocab_logits(x), fast.vocab_logits(x)
    assert got.shape == want.shape == (1, rows, V)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
