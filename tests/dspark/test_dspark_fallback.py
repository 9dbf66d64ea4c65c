"""The auto schedule's plain steps: the drafter rings catch up on deferred taps exactly, a run that mixes plain and
drafting steps still equals plain decoding, and its records and metrics cover the drafting steps only."""
from collections import Counter

import pytest
import torch

from engine.dspark.drafter_cache import DrafterCache
from engine.dspark.schedule import ThroughputTable
from engine.generation import DSparkConfig, generate, generate_speculative
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget
from tests.model_helpers import tiny_model

V = 64
PROMPTS = [[0, 5, 7, 9, 11], [0, 10, 20], [0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
# verifying is cheap but a draft costs as much as two plain steps: drafting pays only when the drafter's
# confidences promise about three tokens a step, which a random-init drafter does now and then
COSTLY = ThroughputTable([1, 3, 6, 18], [100.0, 95.0, 90.0, 60.0], draft_rows=[1, 2, 4],
                         draft_seconds=[0.02, 0.021, 0.022])


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1)


@pytest.mark.parametrize("steps", [[1, 2, 1], [3, 9, 7, 1, 5, 6]], ids=["short", "past-the-ring"])
def test_deferred_taps_catch_up_to_the_rings_of_step_by_step_appends(model, steps):
    """Taps deferred over several plain steps (more than the ring's slots in the second case, whose oldest are
    dropped) leave the rings, positions and restorable margin as appending them one step at a time (the rows equal
    up to rounding: assert_same_rings)."""
    tokens = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, taps = model(tokens, logits="last")                               # [2, 40, n_taps·dim]
        eager, lazy = (DrafterCache(model, 2, 12) for _ in range(2))
        for rings in (eager, lazy):
            rings.append(model, taps[:, :4], [0, 1])
        at = 4
        for s in steps:
            eager.append(model, taps[:, at:at + s], [0, 1])
            lazy.defer(taps[:, at:at + s], [0, 1])
            at += s
        with pytest.raises(ValueError, match="deferred taps"):
            lazy.read(torch.tensor([0]))
        lazy.catch_up(model, [0, 1])
        assert lazy.deferred == {} and torch.equal(lazy.pos, eager.pos)
        assert torch.equal(lazy.high_water, eager.high_water)
        for row in (0, 1):
            assert_same_rings(eager.live_state(row), lazy.live_state(row))
        for rings in (eager, lazy):   # the last margin positions stay restorable
            rings.rollback(torch.tensor([max(at - 12, 4), at - 3]), torch.tensor([0, 1]))
        for row in (0, 1):
            assert_same_rings(eager.live_state(row), lazy.live_state(row))


def assert_same_rings(want: dict, got: dict) -> None:
    """The same positions, and the same ring rows up to rounding: a catch-up computes a stretch's rows in one call,
    the step-by-step appends in several, and matrix products over different row counts may sum in another order;
    the rows' FP8 rounding absorbs nearly all of that, but a value on a rounding boundary moves by one FP8 step."""
    assert want.keys() == got.keys() and torch.equal(want["pos"], got["pos"])
    for key in want.keys() - {"pos"}:
        assert want[key].shape == got[key].shape, key
        torch.testing.assert_close(got[key], want[key], rtol=0.125, atol=0, msg=key)   # e4m3: 3 mantissa bits
        assert (got[key] != want[key]).float().mean() <= 0.01, key


def test_a_run_with_plain_steps_equals_plain_decoding(model):
    """Greedy output equals plain greedy output when the auto schedule takes plain steps between drafting steps;
    the DSpark records and metrics cover the drafting steps, the plain steps are counted apart, and every
    generated token is traced."""
    want = generate(model, PROMPTS, GenerationRequest.of(20, seed=0))
    trace = Trace(TraceBudget(max_tokens=None))
    res = generate_speculative(model, PROMPTS,
                               GenerationRequest.of(20, seed=0, trace=trace, dspark=DSparkConfig("auto", sps=COSTLY)))
    assert res.tokens == want.tokens and res.finish_reasons == want.finish_reasons
    drafting = {s.step for s in res.steps}
    assert res.plain_steps > 0 and len(drafting) > 1
    assert res.target_forwards == len(drafting) and len(res.step_times) == len(drafting) + res.plain_steps
    # a plain step commits one token per active row, a drafting step its accepted drafts plus one
    per_step = Counter(t.step for row in range(len(PROMPTS)) for t in trace.tokens(row) if t.generated)
    plain = set(per_step) - drafting - {0}                                   # step 0: the prefill's token
    assert len(plain) == res.plain_steps and all(per_step[s] <= len(PROMPTS) for s in plain)
    assert sum(per_step[s] for s in drafting) == sum(s.accepted + 1 for s in res.steps)
    assert per_step[0] == len(PROMPTS) and sum(per_step.values()) == sum(map(len, res.tokens))
    assert trace.dspark_steps == res.steps
    assert res.metrics.mean_step_s == pytest.approx((res.decode_s - res.plain_s) / len(drafting))
    for row, toks in enumerate(want.tokens):
        assert [t.token_id for t in trace.tokens(row) if t.generated] == toks
    # without the drafter's costs in the table (or with the fallback off) every step drafts
    free = ThroughputTable(COSTLY.batch_tokens, COSTLY.steps_per_second)
    again = generate_speculative(model, PROMPTS,
                                 GenerationRequest.of(16, seed=0, dspark=DSparkConfig("auto", sps=free)))
    assert again.tokens == [t[:16] for t in want.tokens] and again.plain_steps == 0
    assert DSparkConfig("auto", sps=COSTLY, plain_fallback=False).fallback() is None
    assert DSparkConfig("all").fallback() is None and DSparkConfig("auto", sps=COSTLY).fallback() is not None


@pytest.mark.parametrize("block_over_plain", [None, 1.0, 1e9], ids=["measured", "cheap-block", "costly-block"])
def test_graphed_runs_verify_every_draft_or_none_and_keep_the_plain_steps(model, monkeypatch, block_over_plain):
    """With cuda_graphs (on the CPU: the static bodies, eagerly) or compiled, a verify block is γ + 1 wide whatever
    the schedule's ℓ, so at each drafting step the auto schedule verifies every draft the token budget allows on
    every row, or none (the anchors through the one-token GraphedDecoder its plain steps also use) when the block's
    cost in plain forwards (the run's own timings; here also set by hand) exceeds the expected tokens. Greedy output
    still equals plain decoding."""
    from engine.generation import speculative
    if block_over_plain is not None:
        monkeypatch.setattr(speculative._Speculation, "_block_over_plain", lambda self: block_over_plain)
    want = generate(model, PROMPTS, GenerationRequest.of(20, seed=0))
    res = generate_speculative(model, PROMPTS,
                               GenerationRequest.of(20, seed=0, cuda_graphs=True, dspark=DSparkConfig("auto",
                                                    sps=COSTLY)))
    assert res.tokens == want.tokens and res.finish_reasons == want.finish_reasons
    assert res.plain_steps > 0 and res.graphed_plain_steps == res.plain_steps
    assert res.graphed_forwards == res.target_forwards == len({s.step for s in res.steps}) > 1
    gamma = model.args.dspark_block_size
    verified = {}
    for s in res.steps:
        made = s.anchor_pos - len(PROMPTS[s.row]) + 1                        # tokens the row had (anchor included)
        room = min(gamma, 20 - made - 1)
        assert s.verify_len in (0, room)
        if room:
            verified.setdefault(s.step, set()).add(s.verify_len > 0)
    assert all(len(kinds) == 1 for kinds in verified.values())              # all rows verify their drafts, or none
    if block_over_plain is not None:   # a block as cheap as a plain forward always pays; a costly one never
        assert {kind for kinds in verified.values() for kind in kinds} == {block_over_plain == 1.0}
