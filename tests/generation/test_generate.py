"""Generation: sampling semantics (greedy, exact top-k/top-p masks, seeds), stop tokens, batching, streaming, traces."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.generation import generate
from engine.model import Transformer, init_weights
from engine.model.sampling import apply_history_rules, filter_logits, make_generators, probabilities, sample
from engine.request import GenerationRequest, SamplingParams
from engine.spec.config import load_config
from engine.spec.presets import list_presets
from engine.speedups import prepare_for_inference
from engine.trace import Trace, TraceBudget, load_trace, save_trace


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


def test_greedy_is_argmax_whatever_the_cuts():
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 1.0, 1.0, 0.0]])
    for p in (SamplingParams(), SamplingParams(0.0, top_k=1, top_p=0.1)):
        assert sample(logits, p, [None, None]).tolist() == [1, 0]
    assert probabilities(logits, SamplingParams())[0].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_k_keeps_exactly_the_k_largest_and_boundary_ties():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0, -1.0]])
    assert kept(filter_logits(logits, top_k=3)) == {1, 2, 3}
    assert kept(filter_logits(logits, top_k=1)) == {1}
    assert kept(filter_logits(logits, top_k=0)) == set(range(6))
    assert kept(filter_logits(logits, top_k=99)) == set(range(6))
    tied = torch.tensor([[2.0, 1.0, 2.0, 0.0]])
    assert kept(filter_logits(tied, top_k=1)) == {0, 2}
    # surviving logits are unchanged
    assert filter_logits(logits, top_k=3)[0, 1] == 5.0


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]])  # sorted: 1 (0.5), 3 (0.25), then 0 and 2
    logits = probs.log()
    assert kept(filter_logits(logits, top_p=0.4)) == {1}          # 0.5 already reaches 0.4
    assert kept(filter_logits(logits, top_p=0.6)) == {1, 3}       # 0.5 < 0.6 → 0.75
    k = kept(filter_logits(logits, top_p=0.8))                    # 0.75 < 0.8 → one of the tied 0.125s
    assert len(k) == 3 and {1, 3} < k
    assert kept(filter_logits(logits, top_p=1.0)) == {0, 1, 2, 3}
    # top-k is applied before top-p: after k=2 the nucleus is computed on the renormalised pair
    assert kept(filter_logits(logits, top_k=2, top_p=0.6)) == {1}  # 0.5/0.75 = 0.67 >= 0.6


def test_sampling_draws_only_allowed_tokens_with_the_right_frequencies():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).log_softmax(-1)
    params = SamplingParams(temperature=1.0, top_k=3)
    gen = make_generators([7], "cpu")
    draws = torch.stack([sample(logits, params, gen) for _ in range(4000)]).flatten()
    counts = torch.bincount(draws, minlength=5).float()
    assert counts[2] == counts[3] == 0
    expected = probabilities(logits, params)[0] * 4000
    # each count within 5 standard deviations of its binomial expectation
    sd = (expected * (1 - expected / 4000)).sqrt()
    assert torch.all((counts - expected).abs() <= 5 * sd + 1e-6), (counts, expected)


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = probabilities(logits, SamplingParams(temperature=0.5))[0]
    hot = probabilities(logits, SamplingParams(temperature=2.0))[0]
    torch.testing.assert_close(cold, torch.softmax(logits[0] / 0.5, -1))
    assert cold[0] > torch.softmax(logits[0], -1)[0] > hot[0]


def test_seeds_reproduce_and_differ():
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0)

    def draw(seeds):
        gens = make_generators(seeds, "cpu")
        return torch.stack([sample(logits, params, gens) for _ in range(20)]).tolist()

    assert draw([1, 2]) == draw([1, 2])
    assert draw([1, 2]) != draw([3, 4])
    # a row's draws depend only on its own seed
    assert [r[0] for r in draw([1, 2])] == [r[0] for r in draw([1, 9])]


def test_bad_parameters_are_named():
    for kwargs, word in (({"temperature": -1}, "temperature"), ({"top_k": -2}, "top_k"),
                         ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                         ({"temperature": float("nan")}, "temperature")):
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample(torch.zeros(5), SamplingParams(1.0), [None])


def test_repetition_penalty_lowers_every_seen_logit_ctrl_style():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0], [2.0, -1.0, 0.5, 3.0, -2.0]])
    out = apply_history_rules(logits, [[0, 1, 1, 4], []], SamplingParams(repetition_penalty=2.0))
    # seen tokens 0, 1, 4: positive logits halve, negative ones double; unseen ones and the empty history keep theirs
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0, -4.0], [2.0, -1.0, 0.5, 3.0, -2.0]]
    assert apply_history_rules(logits, [[0], [1]], SamplingParams()) is logits      # off: the very same tensor
    greedy = apply_history_rules(logits[:1], [[3]], SamplingParams(repetition_penalty=1.6))
    assert int(greedy.argmax()) == 0                                               # 3.0 / 1.6 < 2.0


def test_no_repeat_ngram_bans_exactly_the_completions_of_seen_ngrams():
    logits = torch.zeros(3, 6)
    history = [[1, 2, 3, 1, 2, 4, 1, 2], [5, 5], [0, 1, 2, 3, 4, 5]]
    out = apply_history_rules(logits, history, SamplingParams(no_repeat_ngram=3))
    assert kept(out[0:1]) == {0, 1, 2, 5}          # (1, 2) was followed by 3 and by 4
    assert kept(out[1:2]) == set(range(6))         # shorter than n: nothing to repeat
    assert kept(out[2:3]) == set(range(6))         # (4, 5) never occurred before
    bigrams = apply_history_rules(logits[:1], [[4, 0, 4, 4, 2, 4]], SamplingParams(no_repeat_ngram=2))
    assert kept(bigrams) == {1, 3, 5}              # the last token 4 was followed by 0, 4 and 2
    unigrams = apply_history_rules(logits[:1], [[1, 3, 3]], SamplingParams(no_repeat_ngram=1))
    assert kept(unigrams) == {0, 2, 4, 5}          # n = 1: no token of the history again
    # a ban that would leave no token at all is lifted for that row
    assert kept(apply_history_rules(logits[:1], [list(range(6))], SamplingParams(no_repeat_ngram=1))) == set(range(6))
    with pytest.raises(ValueError, match="2 rows of logits but 1 histories"):
        apply_history_rules(logits[:2], [[1]], SamplingParams(no_repeat_ngram=2))


def test_bad_history_settings_are_named():
    for kwargs, word in (({"repetition_penalty": 0.0}, "repetition_penalty"),
                         ({"repetition_penalty": -1.2}, "repetition_penalty"),
                         ({"repetition_penalty": float("inf")}, "repetition_penalty"),
                         ({"repetition_penalty": float("nan")}, "repetition_penalty"),
                         ({"repetition_penalty": True}, "repetition_penalty"),
                         ({"no_repeat_ngram": -1}, "no_repeat_ngram"), ({"no_repeat_ngram": 2.0}, "no_repeat_ngram"),
                         ({"no_repeat_ngram": True}, "no_repeat_ngram")):
        with pytest.raises(ValueError, match=word):
            SamplingParams(**kwargs)
    assert SamplingParams(repetition_penalty=1, no_repeat_ngram=0).uses_history is False
    assert SamplingParams(repetition_penalty=0.8).uses_history and SamplingParams(no_repeat_ngram=3).uses_history


# ---- generation on the tiny V4.1 model ------------------------------------------------------------



def build(max_seq_len: int | None = None):
    args = load_config(list_presets()["tiny-v4.1"])
    if max_seq_len is not None:
        args = args.replace(max_seq_len=max_seq_len)
    model = prepare_for_inference(Transformer(args, np.arange(args.vocab_size) % args.engram_compressed_vocab_size))
    init_weights(model, seed=1)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return build()


PROMPTS = [[0, 17, 999, 5, 1234], [0, 4242], [0, 7, 7, 7, 8, 9, 10]]


def test_greedy_equals_argmax_of_full_forward_without_cache(model):
    res = generate(model, [PROMPTS[0]], GenerationRequest.of(4, stop_tokens=()))
    seq = list(PROMPTS[0])
    with torch.inference_mode():
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq]), logits="last").logits.argmax(-1)))
    assert res.tokens[0] == seq[len(PROMPTS[0]):]
    assert res.finish_reasons == ["length"]


def test_batch_of_different_lengths_equals_each_alone(model):
    batch = generate(model, PROMPTS, GenerationRequest.of(4, stop_tokens=()))
    alone = [generate(model, [p], GenerationRequest.of(4, stop_tokens=())).tokens[0] for p in PROMPTS]
    assert batch.tokens == alone
    # sampling too: row i uses seed + i, so a prompt alone with that seed draws the same tokens
    sampled = generate(model, PROMPTS[:2], GenerationRequest.of(3, temperature=1.0, seed=10, stop_tokens=()))
    second = generate(model, [PROMPTS[1]], GenerationRequest.of(3, temperature=1.0, seed=11, stop_tokens=()))
    assert sampled.tokens[1] == second.tokens[0]


def test_seeded_sampling_reproduces_and_seeds_differ(model):
    def run(seed):
        return generate(model, [PROMPTS[0]],
                        GenerationRequest.of(4, temperature=1.0, top_p=0.9, seed=seed, stop_tokens=())).tokens
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_stop_tokens_end_a_row_without_emitting_the_stop_token(model):
    free = generate(model, PROMPTS[:2], GenerationRequest.of(4, stop_tokens=())).tokens
    stop = free[0][2]
    cut = free[0][: free[0].index(stop)]
    res = generate(model, PROMPTS[:2], GenerationRequest.of(4, stop_tokens=(stop,)))
    assert res.tokens[0] == cut and res.finish_reasons[0] == "stop"
    other = free[1][: free[1].index(stop)] if stop in free[1] else free[1]
    assert res.tokens[1] == other  # the other row is unaffected by row 0 finishing


def test_streaming_callback_sees_every_token_in_order(model):
    calls = []
    res = generate(model, PROMPTS, GenerationRequest.of(3, stop_tokens=()),
                   on_token=lambda row, tok, info: calls.append((info.step, row, tok, info.pos)))
    assert calls == sorted(calls, key=lambda c: (c[0], c[1]))  # step by step, rows in order within a step
    for row, prompt in enumerate(PROMPTS):
        mine = [c for c in calls if c[1] == row]
        assert [c[2] for c in mine] == res.tokens[row]
        assert [c[3] for c in mine] == list(range(len(prompt), len(prompt) + 3))


def test_a_decode_step_is_timed_with_its_token_choice_and_without_the_callers_callback(model, monkeypatch):
    """decode_s counts what every decoding step does, the draw included (as a DSpark step's time counts its
    verifier's), so that DSpark's tokens/s compare like for like; the caller's on_token is not decoding."""
    import time

    import engine.generation.plain as plain
    real = plain.probabilities
    monkeypatch.setattr(plain, "probabilities", lambda *a: time.sleep(0.05) or real(*a))
    res = generate(model, [PROMPTS[0]], GenerationRequest.of(4, temperature=1.0, seed=0, stop_tokens=()),
                   on_token=lambda row, tok, info: time.sleep(0.3))
    assert len(res.step_times) == 3 and res.decode_s == pytest.approx(sum(res.step_times))
    assert all(t >= 0.05 for t in res.step_times)                  # each step's draw, which plain.generate times
    assert res.decode_s < 3 * 0.3                                  # the callbacks (4 × 0.3 s) are not decode


def test_prompt_errors_and_the_sequence_limit():
    small = build(max_seq_len=8)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(small, [[0], []], GenerationRequest.greedy(2))
    with pytest.raises(ValueError, match="max_seq_len of 8"):
        generate(small, [list(range(9))], GenerationRequest.greedy(2))
    with pytest.raises(ValueError, match=r"outside 0\.\.129279"):
        generate(small, [[0, 129280]], GenerationRequest.greedy(2))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(small, [[0]], GenerationRequest.greedy(-1))
    nothing = generate(small, [[0, 3]], GenerationRequest.greedy(0))
    assert nothing.tokens == [[]] and nothing.finish_reasons == ["length"]
    res = generate(small, [[0, 1, 2, 3, 4, 5]], GenerationRequest.of(10, stop_tokens=()))
    assert len(res.tokens[0]) == 2 and res.finish_reasons == ["max_seq_len"]


def test_trace_does_not_change_logits(model):
    tokens = torch.tensor([PROMPTS[2]])
    with torch.inference_mode():
        plain_cache, traced_cache = model.new_cache(1), model.new_cache(1)
        trace = Trace(TraceBudget(attention=True))
        a = model(tokens, plain_cache, logits="all").logits
        b = model(tokens, traced_cache, logits="all", trace=trace).logits
        c = model(torch.tensor([[42]]), plain_cache).logits
        d = model(torch.tensor([[42]]), traced_cache, trace=trace).logits
    assert torch.equal(a, b) and torch.equal(c, d)
    assert trace.summary()["records"]["attention"] > 0


def test_generation_trace_records_everything_and_round_trips(model, tmp_path):
    trace = Trace(TraceBudget(top_k_logits=4), meta={"test": True})
    res = generate(model, PROMPTS[:2], GenerationRequest.of(3, stop_tokens=(), trace=trace),
                   token_text=lambda t: f"<{t}>")
    args = model.args
    for row, prompt in enumerate(PROMPTS[:2]):
        toks = trace.tokens(row)
        assert [t.token_id for t in toks] == prompt + res.tokens[row]
        assert [t.generated for t in toks] == [False] * len(prompt) + [True] * 3
        assert toks[-1].text == f"<{res.tokens[row][-1]}>" and toks[-1].top_ids[0] == res.tokens[row][-1]
        # facts for every position that went through the model (the last new token was never fed back)
        n_fed = len(prompt) + 2
        moe = {(p, pos) for p, _, r, pos, _ in trace.facts("moe") if r == row}
        assert moe == {(f"layers.{i}.ffn", pos) for i in range(args.n_layers) for pos in range(n_fed)}
    assert trace.paths("engram") == [f"layers.{i}.engram" for i in args.engram_layer_ids]
    for name in ("t.json", "t.parquet.zip", "t.safetensors"):
        save_trace(trace, tmp_path / name)
        assert load_trace(tmp_path / name) == trace


def test_history_rules_steer_greedy_decoding_as_a_step_by_step_reference(model):
    # a penalty below 1 favours the history's tokens, so the n-gram ban has repeats to stop
    rho, prompt = 0.3, PROMPTS[2]
    res = generate(model, [prompt], GenerationRequest.of(8, stop_tokens=(), repetition_penalty=rho, no_repeat_ngram=2))
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(8):
            logits = model(torch.tensor([seq]), logits="last").logits[0].clone()              # [V]
            for t in set(seq):
                logits[t] = logits[t] / rho if logits[t] > 0 else logits[t] * rho
            for i in range(len(seq) - 1):                                                     # bigrams ending seq
                if seq[i] == seq[-1]:
                    logits[seq[i + 1]] = float("-inf")
            seq.append(int(logits.argmax()))
    assert res.tokens[0] == seq[len(prompt):]
    assert res.tokens[0] != generate(model, [prompt], GenerationRequest.of(8, stop_tokens=())).tokens[0]


def test_no_generated_token_repeats_an_ngram_and_rows_keep_their_own_history(model):
    request = GenerationRequest.of(10, stop_tokens=(), repetition_penalty=0.3, no_repeat_ngram=2)
    res = generate(model, PROMPTS, request)
    for prompt, new in zip(PROMPTS, res.tokens):
        seq = prompt + new
        for j in range(len(prompt), len(seq)):
            assert (seq[j - 1], seq[j]) not in set(zip(seq[:j - 1], seq[1:j])), (j, seq)
    assert res.tokens == [generate(model, [p], request).tokens[0] for p in PROMPTS]
    sampled = generate(model, PROMPTS[:2],
                       GenerationRequest.of(6, temperature=1.0, seed=3, stop_tokens=(), repetition_penalty=0.3,
                                            no_repeat_ngram=1))
    for prompt, new in zip(PROMPTS, sampled.tokens):   # n = 1: no token of the prompt or the output comes back
        assert len(set(new)) == len(new) and not set(new) & set(prompt)
