"""The DSpark drafter (spec §7): ring of tapped features, non-causal block attention, Markov head, confidences,
and rollback of both the target cache and the drafter rings."""
import pytest
import torch

from engine.dspark.drafter import draft
from engine.dspark.drafter_cache import DrafterCache
from engine.model.draft import DraftContext, draft_hidden, main_features
from engine.request.sampling import SamplingParams
from tests.model_helpers import tiny_model

V = 64
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float64, vocab_size=V, dspark_noise_token_id=V - 1)


def prefilled(model, tokens, rows=None):
    """Target cache and drafter rings after a prefill of tokens [B, S]."""
    B = tokens.shape[0]
    cache = model.new_cache(B, 64)
    rings = DrafterCache(model, B, cache.margin)
    with torch.inference_mode():
        logits, taps = model(tokens, cache, logits="last")
        rings.append(model, taps, torch.arange(B))
    return cache, rings, logits


def block_hidden(model, rings, rows, ids):
    ring_rows, index = rings.read(rows)
    pos = rings.pos[rows].unsqueeze(1) + torch.arange(ids.shape[1])
    ctx = DraftContext(rows=rows, positions=pos, rings=ring_rows, ring_index=index)
    with torch.inference_mode():
        return draft_hidden(model, ids, ctx)


def test_ring_holds_rope_features_of_the_last_window_positions(model):
    toks = torch.randint(0, V, (1, 13), generator=torch.Generator().manual_seed(0))
    _, rings, _ = prefilled(model, toks)
    with torch.inference_mode():
        _, taps = model(toks, logits="last")
        x = main_features(model, taps)                                        # [1, 13, dim]
        for st in model.mtp:
            want = st.attn.ring_kv(x, torch.arange(13).unsqueeze(0), True)[0, -model.args.window_size:]
            got = rings.live_state(0)[f"ring.{st.attn.layer}"]
            assert torch.equal(got, want)
    assert rings.read(torch.tensor([0]))[1].tolist() == [[t % rings.slots for t in range(5, 13)]]


def test_block_attention_is_non_causal_and_reads_only_the_window(model):
    toks = torch.randint(0, V, (1, 13), generator=torch.Generator().manual_seed(1))
    _, rings, _ = prefilled(model, toks)
    rows, noise = torch.tensor([0]), model.args.dspark_noise_token_id
    ids = torch.tensor([[5, noise, noise, noise, noise]])
    base = block_hidden(model, rings, rows, ids)
    later = block_hidden(model, rings, rows, torch.tensor([[5, noise, noise, noise, 7]]))
    assert not torch.allclose(base[0, 0], later[0, 0])          # the first query sees the last block row
    layer = model.mtp[0].attn.layer
    old_slot, new_slot = 4 % rings.slots, 12 % rings.slots      # position 4 left the 8-wide window; 12 is in it
    saved = rings.rings[layer].clone()
    rings.rings[layer][0, old_slot] += 1.0
    assert torch.equal(block_hidden(model, rings, rows, ids), base)
    rings.rings[layer][0, new_slot] += 1.0
    assert not torch.allclose(block_hidden(model, rings, rows, ids), base)
    rings.rings[layer].copy_(saved)


def test_markov_head_conditions_each_draft_on_the_previous_one(model):
    toks = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    _, rings, _ = prefilled(model, toks)
    rows = torch.arange(2)
    with torch.inference_mode():
        d = draft(model, rings, rows, torch.tensor([3, 4]), GREEDY, [None, None])
        noise = model.args.dspark_noise_token_id
        hidden = block_hidden(model, rings, rows, torch.tensor([[3] + [noise] * 4, [4] + [noise] * 4]))
        last = model.mtp[-1]
        base = torch.nn.functional.linear(last.norm(hidden), model.head.weight)   # [2, 5, V]
        prev = torch.tensor([3, 4])
        for k in range(5):
            e = last.markov_head.embed(prev)
            logits = base[:, k] + e @ last.markov_head.head.weight.T
            assert torch.equal(d.tokens[:, k], logits.argmax(-1))
            z = torch.cat([hidden[:, k], e], -1) @ last.confidence_head.proj.weight[0]
            assert torch.allclose(d.confidence_logits[:, k], z.float())
            prev = d.tokens[:, k]
    c = d.confidence()
    assert bool(((c > 0) & (c < 1)).all())
    assert d.q is None and torch.equal(d.draft_probs(), torch.ones(2, 5))   # greedy q is one-hot: not built


def test_rollback_restores_target_and_drafter_state_exactly(model):
    """Verify a block, roll the rejected part back: every cache equals the state before those tokens, and the
    next draft and target step equal those of caches that never saw the rejected tokens."""
    g = torch.Generator().manual_seed(3)
    toks = torch.randint(0, V, (2, 10), generator=g)
    committed = torch.randint(0, V, (2, 2), generator=g)            # anchor + 1 accepted draft
    rejected = torch.randint(0, V, (2, 4), generator=g)
    cache, rings, _ = prefilled(model, toks)
    ref_cache, ref_rings, _ = prefilled(model, torch.cat([toks, committed], 1))
    rows = torch.arange(2)
    with torch.inference_mode():
        _, taps = model(torch.cat([committed, rejected], 1), cache, logits="all")
        rings.append(model, taps, rows)
    cache.rollback(12, rows)
    rings.rollback(12, rows)
    for r in range(2):
        for name, want in ref_cache.live_state(r).items():
            assert torch.equal(cache.live_state(r)[name], want), name
        for name, want in ref_rings.live_state(r).items():
            assert torch.equal(rings.live_state(r)[name], want), name
    with torch.inference_mode():
        a = draft(model, rings, rows, torch.tensor([1, 2]), GREEDY, [None, None])
        b = draft(model, ref_rings, rows, torch.tensor([1, 2]), GREEDY, [None, None])
        nxt = torch.tensor([[1], [2]])
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.confidence_logits, b.confidence_logits)
        assert torch.equal(model(nxt, cache).logits, model(nxt, ref_cache).logits)


def test_drafter_rollback_refuses_what_it_cannot_restore(model):
    toks = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(4))
    _, rings, _ = prefilled(model, toks)
    with pytest.raises(ValueError, match="only the last"):
        rings.rollback(30 - rings.margin - 1, [0])
    with pytest.raises(ValueError, match="it is at 30"):
        rings.rollback(31, [0])
    rings.rollback(30 - rings.margin, [0])
    assert int(rings.pos[0]) == 30 - rings.margin


def test_teacher_forced_drafts_equal_generation_drafts(model):
    """Many anchors of one sequence at once give the logits the generation-time drafter gives, when the
    sequence continues with the drafted tokens (so teacher forcing feeds the Markov head the same tokens)."""
    from engine.dspark.teacher_forced import draft_teacher_forced
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (1, 11), generator=g)
    _, rings, _ = prefilled(model, prefix[:, :10])
    with torch.inference_mode():
        d = draft(model, rings, torch.tensor([0]), prefix[0, 10:11], SamplingParams(temperature=1.0),
                  [torch.Generator().manual_seed(0)])
        seq = torch.cat([prefix[0], d.tokens[0]])                             # anchor at 10, drafts at 11..15
        _, taps = model(seq.unsqueeze(0), logits="last")
        out = draft_teacher_forced(model, seq, taps[0], torch.tensor([3, 10]))
    assert torch.allclose(torch.softmax(out.logits[1], -1).float(), d.q[0], atol=1e-6)
    assert torch.allclose(out.confidence_logits[1].float(), d.confidence_logits[0], atol=1e-6)
    assert torch.equal(out.targets[1], d.tokens[0]) and torch.equal(out.targets[0], seq[4:9])
    with pytest.raises(ValueError, match="anchors must lie in"):
        draft_teacher_forced(model, seq, taps[0], torch.tensor([0]))


def test_teacher_forced_draft_is_differentiable():
    from engine.dspark.teacher_forced import draft_teacher_forced
    from engine.model import EngineOptions
    m = tiny_model(dtype=torch.float32, options=EngineOptions(quant_sim=False), vocab_size=V,
                   dspark_noise_token_id=V - 1)   # training runs without the cache quant-dequant
    seq = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, taps = m(seq.unsqueeze(0), logits="last")
    out = draft_teacher_forced(m, seq, taps[0], torch.arange(1, 12))
    valid = out.targets >= 0
    loss = torch.nn.functional.cross_entropy(out.logits[valid], out.targets[valid])
    loss.backward()
    stage = m.mtp[0]
    assert stage.main_proj.weight.grad is not None and stage.main_proj.weight.grad.abs().sum() > 0
    assert m.mtp[-1].markov_head.head.weight.grad.abs().sum() > 0
    assert out.targets[-1, 0] == -1   # the last anchor has no next token
