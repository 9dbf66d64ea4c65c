"""DSpark generation end to end: greedy output equals plain greedy, the scheduler runs across a batch, trace facts."""
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.dspark.schedule import ThroughputTable, schedule_threshold, schedule_throughput
from engine.generation import DSparkConfig, generate, generate_speculative
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget
from tests.model_helpers import tiny_model

V = 64   # small enough that random-init drafts are sometimes right, so both verification outcomes occur
PROMPTS = [[0, 5, 7, 9, 11], [0, 10, 20], [0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [0, 1]]
# a machine where verifying more than 8 tokens at once gets expensive: Alg. 1 must cut somewhere
STEEP = ThroughputTable([1, 4, 8, 12, 24], [100.0, 95.0, 80.0, 30.0, 10.0])


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1)


@pytest.fixture(scope="module")
def plain(model):
    return generate(model, PROMPTS, GenerationRequest.of(20, seed=0))


@pytest.mark.parametrize("cfg", [DSparkConfig("all"), DSparkConfig("threshold", 0.6), DSparkConfig("auto", sps=STEEP),
                                 DSparkConfig("auto", sps=STEEP, early_stop=False)],
                         ids=["all", "threshold", "auto", "auto-global"])
def test_greedy_output_equals_plain_greedy(model, plain, cfg):
    res = generate_speculative(model, PROMPTS, GenerationRequest.of(20, seed=0, dspark=cfg))
    assert res.tokens == plain.tokens
    assert res.finish_reasons == plain.finish_reasons == ["length"] * 4
    m = res.metrics
    assert m.accepted > 0 and m.accepted < m.scheduled or cfg.schedule == "auto"   # both outcomes occurred
    assert m.target_forwards < 20   # fewer target forwards than plain decode's 19 + prefill: steps commit ≥ 1 token
    # every step commits its accepted drafts plus one target token; the budget cap means none is wasted
    assert sum(len(t) for t in res.tokens) == len(PROMPTS) + sum(s.accepted + 1 for s in res.steps)


@pytest.mark.parametrize("options, cfg", [({"repetition_penalty": 1.5}, DSparkConfig("all")),
                                          ({"no_repeat_ngram": 2}, DSparkConfig("all")),
                                          ({"repetition_penalty": 0.5, "no_repeat_ngram": 3},
                                           DSparkConfig("threshold", 0.6))],
                         ids=["penalty", "no-repeat", "both"])
def test_greedy_output_under_history_rules_equals_plain_greedy_under_them(model, plain, options, cfg):
    want = generate(model, PROMPTS, GenerationRequest.of(20, seed=0, **options))
    assert want.tokens != plain.tokens   # the rules change the text, so the equality below has power
    # each verified position is judged with the drafts before it in its history
    res = generate_speculative(model, PROMPTS, GenerationRequest.of(20, seed=0, dspark=cfg, **options))
    assert res.tokens == want.tokens and res.finish_reasons == want.finish_reasons
    m = res.metrics
    assert 0 < m.accepted < m.scheduled


def test_schedules_are_applied_per_step_across_the_batch(model):
    budget = 24  # long enough that the budget cap only matters in the last steps
    for cfg, rule in [(DSparkConfig("auto", sps=STEEP), lambda c: schedule_throughput(c, STEEP)),
                      (DSparkConfig("threshold", 0.6), lambda c: schedule_threshold(c, 0.6))]:
        res = generate_speculative(model, PROMPTS, GenerationRequest.of(budget, seed=0, dspark=cfg))
        by_step = defaultdict(list)
        for s in res.steps:
            by_step[s.step].append(s)
        for rows in by_step.values():  # rows of a step are the active requests, in row order
            want = rule(torch.from_numpy(np.stack([s.confidences for s in rows])))
            # a request never verifies past its token budget: anchor + ℓ drafts + 1 target token ≤ what is left
            room = [budget - 2 - sum(x.accepted + 1 for x in res.steps if x.row == s.row and x.step < s.step)
                    for s in rows]
            assert [s.verify_len for s in rows] == [min(w, r) for w, r in zip(want, room)]
        assert len(by_step) >= 6 and len(by_step[1]) == len(PROMPTS)
        if cfg.schedule == "auto":  # the steep table makes the batch share a budget: not everyone verifies 5
            assert any(sum(s.verify_len for s in rows) < 5 * len(rows) for rows in by_step.values())


def test_stop_token_inside_accepted_drafts_truncates(model, plain):
    stop = plain.tokens[0][6]  # a token greedy decoding of prompt 0 emits
    a = generate(model, PROMPTS, GenerationRequest.of(20, seed=0, stop_tokens=(stop,)))
    b = generate_speculative(model, PROMPTS, GenerationRequest.of(20, seed=0, stop_tokens=(stop,)))
    assert b.tokens == a.tokens and b.finish_reasons == a.finish_reasons
    assert b.finish_reasons[0] == "stop" and stop not in b.tokens[0]


def test_model_max_seq_len_ends_rows_like_plain_decoding():
    m = tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1, max_seq_len=24)
    a = generate(m, PROMPTS, GenerationRequest.of(30, seed=0))
    b = generate_speculative(m, PROMPTS, GenerationRequest.of(30, seed=0))
    assert b.tokens == a.tokens and b.finish_reasons == a.finish_reasons
    assert b.finish_reasons[2] == "max_seq_len" and len(PROMPTS[2]) + len(b.tokens[2]) == 24


def test_sampling_is_reproducible_and_row_seeded(model):
    request = GenerationRequest.of(8, temperature=0.8, top_k=20, stop_tokens=(), seed=[7, 8, 9, 10])
    a = generate_speculative(model, PROMPTS, request)
    b = generate_speculative(model, PROMPTS, request)
    c = generate_speculative(model, PROMPTS, request.with_sampling(seed=[7, 8, 9, 11]))
    assert a.tokens == b.tokens and a.tokens[:3] == c.tokens[:3]
    assert all(len(t) == 8 for t in a.tokens)


def test_graphed_verify_under_history_rules_drafts_eagerly_and_equals_plain(model):
    want = generate(model, PROMPTS, GenerationRequest.of(12, seed=0, no_repeat_ngram=2))
    res = generate_speculative(model, PROMPTS, GenerationRequest.of(12, seed=0, cuda_graphs=True, no_repeat_ngram=2))
    assert res.tokens == want.tokens
    assert res.graphed_drafts == 0 and res.graphed_forwards > 0   # the graphed drafter knows no rules


def test_sampling_under_history_rules_is_reproducible_and_never_breaks_a_ban(model):
    request = GenerationRequest.of(12, temperature=1.0, stop_tokens=(), no_repeat_ngram=2, repetition_penalty=1.3,
                                   seed=[7, 8, 9, 10])
    a = generate_speculative(model, PROMPTS, request)
    assert a.tokens == generate_speculative(model, PROMPTS, request).tokens
    for prompt, new in zip(PROMPTS, a.tokens):   # an accepted draft is never a banned token
        seq = prompt + new
        for j in range(len(prompt), len(seq)):
            assert (seq[j - 1], seq[j]) not in set(zip(seq[:j - 1], seq[1:j])), (j, seq)


def test_trace_records_every_step_and_only_committed_tokens(model, plain):
    trace = Trace(TraceBudget(max_tokens=None))
    res = generate_speculative(model, PROMPTS, GenerationRequest.of(20, seed=0, trace=trace))
    assert trace.dspark_steps == res.steps and len(res.steps) > 0
    for row, toks in enumerate(plain.tokens):
        gen = [t for t in trace.tokens(row) if t.generated]
        assert [t.token_id for t in gen] == toks
        assert [t.pos for t in gen] == list(range(len(PROMPTS[row]), len(PROMPTS[row]) + 20))
        # the target's facts cover exactly the positions it processed and kept: rejected ones were rolled back
        moe = trace.table("moe")
        target = {int(p) for p, r, path in zip(moe["pos"], moe["row"], moe["path"]) if r == row
                  and path.startswith("layers.")}
        assert target == set(range(len(PROMPTS[row]) + 20 - 1))
    for s in res.steps:
        assert 0 <= s.accepted <= s.verify_len <= 5 and len(s.drafted) == 5
        assert all(s.survival[k + 1] <= s.survival[k] for k in range(4))


def test_bad_dspark_options_are_refused(model):
    with pytest.raises(ValueError, match="schedule must be one of"):
        DSparkConfig("fast")
    with pytest.raises(ValueError, match="needs a ThroughputTable"):
        DSparkConfig("auto")
    with pytest.raises(ValueError, match="threshold"):
        DSparkConfig("threshold", 1.5)
    no_draft = tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1, dspark_block_size=0,
                          n_mtp_layers=0, dspark_target_layer_ids=(), dspark_markov_rank=0,
                          compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="no DSpark drafter"):
        generate_speculative(no_draft, PROMPTS, GenerationRequest.greedy(2))


def test_confidence_temperature_rescales_the_logits_per_position(model):
    request = GenerationRequest.of(4, seed=0)
    raw = generate_speculative(model, PROMPTS[:2], request).steps
    t = (1.0, 2.0, 0.5, 4.0, 1.0)
    scaled = generate_speculative(model, PROMPTS[:2], replace(request, dspark=DSparkConfig(confidence_temperature=t))
                                  ).steps
    for a, b in zip(raw, scaled):
        z = torch.logit(torch.from_numpy(a.confidences).double())
        assert torch.allclose(torch.from_numpy(b.confidences).double(), torch.sigmoid(z / torch.tensor(t)), atol=1e-6)
    with pytest.raises(ValueError, match="has 2 values"):
        generate_speculative(model, PROMPTS, replace(request, dspark=DSparkConfig(confidence_temperature=(1.0, 2.0))))
    with pytest.raises(ValueError, match="positive numbers"):
        DSparkConfig(confidence_temperature=(1.0, 0.0, 1.0, 1.0, 1.0))
