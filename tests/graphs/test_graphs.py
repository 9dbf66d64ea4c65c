"""CUDA-graph decode (engine/graphs): static body equals eager decode, is sync-free, keeps the trace; CUDA capture."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.generation import generate
from engine.graphs import CaptureUnsafeError, DecodeInputs, GraphedDecoder, bucket_for, check_capture_safe, decode_body
from engine.model.context import ForwardContext
from engine.request import GenerationRequest
from engine.spec.config import load_config
from engine.trace import FACT_KINDS, Trace, TraceBudget
from tests.model_helpers import TINY, random_tokens, tiny_model

PROMPT_LENS = (3, 9, 6)   # rows at different positions; ratio-2 groups complete on alternate steps


def _prefill(model, cache, prompts, trace=None):
    last = []
    for row, p in enumerate(prompts):
        last.append(model(p.view(1, -1), cache, rows=[row], trace=trace).logits.argmax(-1))
    return torch.stack(last).view(-1, 1)                                     # [n, 1]


def _prompts(seed=3):
    toks = random_tokens(1, 40, seed=seed)[0]
    return [toks[i:i + n] for i, n in enumerate(PROMPT_LENS)]


def _batches(step: int) -> list[int]:
    """Live rows per step: 3 rows (bucket 4, one padding row), 2 rows out of order, a single row."""
    return [[0, 1, 2], [2, 0], [0, 1, 2], [1], [0, 1, 2]][step % 5]


def _states_close(a: dict, b: dict, tol: float) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape, k
        if a[k].numel():
            worst = max(worst, float((a[k].double() - b[k].double()).abs().max()))
    assert worst <= tol, worst
    return worst


@pytest.mark.slow  # 24+ decode steps, twice [12 s]
@pytest.mark.parametrize("bucket_rows", [None, 8])
def test_static_body_decodes_like_eager_step_by_step(bucket_rows):
    """≥ 24 steps crossing compression groups and the window ring's wrap; padded buckets; an idle row
    (row 3, holding a sequence) and the scratch row (4) are the only other rows — the idle one must not change."""
    model = tiny_model()
    prompts = _prompts()
    n = len(prompts)
    eager, graphed = model.new_cache(n, 64), model.new_cache(n + 2, 64)
    with torch.inference_mode():
        nxt = _prefill(model, eager, prompts)
        _prefill(model, graphed, prompts)
        model(random_tokens(1, 5, seed=9), graphed, rows=[3])                 # the idle row's sequence
        idle = {k: v.clone() for k, v in graphed.live_state(3).items()}
        # min_bucket 8: one bucket, larger than the cache, for every batch (≥ 5 padding rows share the scratch row)
        decoder = GraphedDecoder(model, graphed, scratch_row=4, min_bucket=bucket_rows or 1)
        worst, seen = 0.0, set()
        for step in range(24):
            rows = _batches(step)
            tokens = nxt[rows]
            got = decoder.step(tokens, rows).logits
            bucket = max(bucket_for(len(rows)), bucket_rows or 1)
            assert decoder.built == (bucket not in seen)           # a bucket's first step: the one that lays it out
            seen.add(bucket)
            want = model(tokens, eager, rows=rows).logits
            assert got.shape == want.shape and got.dtype == torch.float64
            worst = max(worst, float((got - want).abs().max()))
            nxt[rows] = want.argmax(-1, keepdim=True)
    assert worst <= 1e-9, worst
    assert int(eager.pos.max()) > eager.window_slots                       # the ring wrapped
    assert torch.equal(eager.pos, graphed.pos[:n])
    for r in range(n):
        _states_close(eager.live_state(r), graphed.live_state(r), 1e-12)
    after = graphed.live_state(3)
    assert all(torch.equal(idle[k], after[k]) for k in idle), "a padding row wrote into another sequence's row"
    assert int(graphed.pos[4]) == 0                                         # the scratch row holds no sequence
    assert sorted({b for b, _ in decoder._buckets}) == ([1, 2, 4] if bucket_rows is None else [8])


def test_buckets_are_powers_of_two_and_padding_points_at_the_scratch_row():
    assert [bucket_for(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    with pytest.raises(ValueError, match="at least one row"):
        bucket_for(0)
    model = tiny_model()
    inputs = DecodeInputs(model, 4, scratch_row=7)
    a = model.args
    ids = torch.arange(2 * len(a.engram_layer_ids) * a.engram_n_columns).view(2, 1, len(a.engram_layer_ids), -1)
    inputs.fill(torch.tensor([[11], [12]]), torch.tensor([5, 9]), torch.tensor([1, 0]), (ids, torch.tensor([[3], [4]])))
    assert inputs.tokens.flatten().tolist() == [11, 12, 0, 0]
    assert inputs.positions.flatten().tolist() == [5, 9, 0, 0]
    assert inputs.rows.tolist() == [1, 0, 7, 7]
    assert inputs.compressed.flatten().tolist() == [3, 4, 0, 0]
    assert torch.equal(inputs.engram_ids[:2], ids) and not inputs.engram_ids[2:].any()
    with pytest.raises(ValueError, match="does not fit the 4-row bucket"):
        inputs.fill(torch.zeros(5, 1, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                    torch.arange(5), (torch.zeros(5, 1, *ids.shape[2:], dtype=torch.long), torch.zeros(5, 1)))


def test_compiled_runs_bucket_their_cache_length():
    """Powers of two from 64, capped at the limit but never below what the run needs."""
    from engine.graphs import cache_length_for
    assert [cache_length_for(n, 1024) for n in (1, 64, 65, 200, 513, 1024)] == [64, 64, 128, 256, 1024, 1024]
    assert [cache_length_for(n, 100) for n in (30, 90, 100, 106)] == [64, 100, 100, 106]
    with pytest.raises(ValueError, match="at least one position"):
        cache_length_for(0, 1024)


def test_decoder_refuses_misuse_clearly():
    model = tiny_model()
    cache = model.new_cache(3, 32)
    with pytest.raises(ValueError, match="capture=True needs the model on a CUDA device"):
        GraphedDecoder(model, cache, capture=True)
    with pytest.raises(ValueError, match="scratch_row 5 outside"):
        GraphedDecoder(model, cache, scratch_row=5)
    decoder = GraphedDecoder(model, cache)  # scratch row: 2
    with pytest.raises(RuntimeError, match="no_grad"):
        decoder.step(torch.tensor([[1]]), [0])
    with torch.inference_mode():
        with pytest.raises(ValueError, match="scratch row"):
            decoder.step(torch.tensor([[1], [2]]), [0, 2])
        with pytest.raises(ValueError, match="beyond the cache limit"):
            cache.pos[0] = 32
            decoder.step(torch.tensor([[1]]), [0])


def test_meta_proxy_passes_the_static_body():
    args = load_config(TINY)
    check_capture_safe(args, batch=2)
    check_capture_safe(args, batch=4, trace=False, dtype=torch.float32)


def _eager_layers_body(model, cache, inputs, trace=None):
    """The same layers with static shapes off: ForwardContext.width reads the positions back to the host."""
    ctx = ForwardContext(cache=cache, rows=inputs.rows, start=inputs.positions[:, 0], n_tokens=1,
                         positions=inputs.positions, options=model.options, trace=trace)
    model.run_layers(inputs.tokens, ctx, (inputs.engram_ids, inputs.compressed), "last")


def _item_body(model, cache, inputs, trace=None):
    decode_body(model, cache, inputs, trace)
    int(inputs.logits.argmax())                                              # a deliberate host sync


def _numpy_body(model, cache, inputs, trace=None):
    decode_body(model, cache, inputs, trace)
    inputs.logits.cpu().numpy()


@pytest.mark.parametrize("body, cause", [(_eager_layers_body, "meta"), (_item_body, "meta"), (_numpy_body, "meta")])
def test_meta_proxy_catches_a_host_sync(body, cause):
    """The proxy is not vacuous: the eager layer path (which sizes widths from positions) and bodies that
    read a value back all fail it."""
    with pytest.raises(CaptureUnsafeError, match=cause):
        check_capture_safe(load_config(TINY), batch=2, body=body)


def _fact_lists(trace: Trace):
    return {kind: trace.facts(kind) for kind in FACT_KINDS}


def _assert_same_facts(eager: dict, graphed: dict) -> None:
    for kind in FACT_KINDS:
        assert len(eager[kind]) == len(graphed[kind]) > 0, kind
        for (p1, s1, r1, q1, v1), (p2, s2, r2, q2, v2) in zip(eager[kind], graphed[kind]):
            assert (p1, s1, r1, q1) == (p2, s2, r2, q2)
            for a, b in zip(v1, v2, strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype, (kind, p1, a.shape, b.shape)
                if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
                    assert np.array_equal(a, b), (kind, p1, a, b)
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"{kind} {p1}")


def test_trace_after_eager_replay_equals_the_eager_trace():
    """moe, mhc, engram, attention and lens records of graphed decode steps equal the eager path's (ints exactly,
    floats to float32 rounding), including the top-k lists while fewer rows than index_topk are visible."""
    model = tiny_model()
    toks = random_tokens(1, 40, seed=5)[0]
    prompts = [toks[:2], toks[5:8]]                                         # short: early steps see < topk rows
    traces, logits = [], []
    for graphs in (False, True):
        trace = Trace(TraceBudget(max_tokens=None, attention=True, lens=True))
        cache = model.new_cache(3 if graphs else 2, 32)
        decoder = GraphedDecoder(model, cache) if graphs else None
        out = []
        with torch.inference_mode():
            nxt = _prefill(model, cache, prompts, trace)
            for step in range(10):
                rows = [0, 1] if step % 3 else [1]
                if graphs:
                    lg = decoder.step(nxt[rows], rows, trace).logits
                else:
                    lg = model(nxt[rows], cache, rows=rows, trace=trace).logits
                nxt[rows] = lg.argmax(-1, keepdim=True)
                out.append(lg)
        traces.append(_fact_lists(trace))
        logits.append(torch.cat(out))
    assert float((logits[0] - logits[1]).abs().max()) <= 1e-9
    eager, graphed = traces
    _assert_same_facts(eager, graphed)
    short = [v[0] for p, _, _, q, v in graphed["attention"] if p == "layers.2.attn" and q < 6]
    assert short and min(t.shape[-1] for t in short) < model.args.index_topk  # the trimmed widths were exercised


@pytest.mark.slow  # many verify blocks, graphed and eager [6 s]
def test_verify_blocks_with_rollback_match_eager_logits_taps_cache_and_trace():
    """The DSpark verify shape: anchor + γ drafts per row in one fixed-width step (logits "all", taps), then
    each row rolled back to a random accepted prefix — 8 rounds, rows at different positions, a padded bucket."""
    model = tiny_model()
    S = model.args.dspark_block_size + 1
    prompts = _prompts(seed=7)
    n = len(prompts)
    gen = torch.Generator().manual_seed(0)
    eager, graphed = model.new_cache(n, 64), model.new_cache(n + 1, 64)
    trace_e, trace_g = (Trace(TraceBudget(max_tokens=None, attention=True, lens=True)) for _ in range(2))
    decoder = GraphedDecoder(model, graphed, tokens_per_row=S, logits="all", return_taps=True)
    worst = 0.0
    with torch.inference_mode():
        _prefill(model, eager, prompts, trace_e)
        _prefill(model, graphed, prompts, trace_g)
        for step in range(8):
            rows = [[0, 1, 2], [2, 1], [1]][step % 3]
            block = torch.randint(0, model.args.vocab_size, (len(rows), S), generator=gen)
            anchor = eager.pos[rows].clone()
            want, want_taps = model(block, eager, rows=rows, logits="all", trace=trace_e)
            got, got_taps = decoder.step(block, rows, trace_g)
            assert got.shape == want.shape == (len(rows), S, model.args.vocab_size)
            worst = max(worst, float((got - want).abs().max()), float((got_taps - want_taps).abs().max()))
            keep = anchor + 1 + torch.randint(0, S, (len(rows),), generator=gen)   # anchor + accepted drafts
            for cache, trace in ((eager, trace_e), (graphed, trace_g)):
                cache.rollback(keep, rows)
                for r, k in zip(rows, keep.tolist()):
                    trace.rollback(r, k)
    assert worst <= 1e-9, worst
    assert int(eager.pos.max()) > eager.window_slots
    for r in range(n):
        _states_close(eager.live_state(r), graphed.live_state(r), 1e-12)
    _assert_same_facts(_fact_lists(trace_e), _fact_lists(trace_g))
    check_capture_safe(model.args, batch=2, n_tokens=S, logits="all", taps=True)


@pytest.mark.slow  # generation twice [5 s]
def test_generate_with_graphs_matches_plain_generate():
    model = tiny_model()
    prompts = [[0, 5, 9, 200], [0, 7], [0, 1000, 3, 4, 5, 6]]
    plain = generate(model, prompts, GenerationRequest.of(12, stop_tokens=()))
    trace = Trace(TraceBudget(max_tokens=None))
    graphed = generate(model, prompts, GenerationRequest.of(12, stop_tokens=(), cuda_graphs=True, trace=trace))
    assert graphed.tokens == plain.tokens and graphed.finish_reasons == plain.finish_reasons
    assert len(graphed.step_times) == 11
    assert trace.fact("moe", "layers.9.ffn", 2, len(prompts[2]) + 5) is not None


def test_engine_generates_text_with_graphs_and_dspark():
    """Engine.generate_text passes cuda_graphs through to DSpark decoding (it used to refuse the pair)."""
    from engine.generation import DSparkConfig, Engine
    engine = Engine.load("tiny-v4.1", seed=0)
    runs = [engine.generate_text("hi", GenerationRequest.of(4, seed=0, dspark=DSparkConfig(), cuda_graphs=g))
            for g in (False, True)]
    assert runs[1].texts == runs[0].texts and runs[1].result.tokens == runs[0].result.tokens
    assert runs[0].result.graphed_forwards == 0 < runs[1].result.graphed_forwards == runs[1].result.target_forwards


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: captures and replays real torch.cuda graphs "
                                                          "(run by scripts/gpu_check.sh on a GPU)")
def test_cuda_graph_capture_and_replay_match_eager():
    torch.manual_seed(0)
    model = tiny_model(dtype=torch.float32).cuda()
    prompts = [p.cuda() for p in _prompts()]
    n = len(prompts)
    eager, graphed = model.new_cache(n, 64), model.new_cache(n + 1, 64)
    with torch.inference_mode():
        nxt = _prefill(model, eager, prompts)
        _prefill(model, graphed, prompts)
        decoder = GraphedDecoder(model, graphed)
        assert decoder.capture
        trace_e, trace_g = Trace(TraceBudget(max_tokens=None)), Trace(TraceBudget(max_tokens=None))
        for step in range(20):
            rows = _batches(step)
            want = model(nxt[rows], eager, rows=rows, trace=trace_e).logits
            got = decoder.step(nxt[rows].cpu(), rows, trace_g).logits
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
            nxt[rows] = want.argmax(-1, keepdim=True)
    assert decoder.captured == [1, 2, 4]
    for r in range(n):
        _states_close(eager.live_state(r), graphed.live_state(r), 1e-2)
    ids_e = [v[0] for *_, v in trace_e.facts("moe")]
    ids_g = [v[0] for *_, v in trace_g.facts("moe")]
    assert len(ids_e) == len(ids_g) and sum(np.array_equal(a, b) for a, b in zip(ids_e, ids_g)) >= 0.95 * len(ids_e)


def generate_with_and_without_graphs(tmp_path, capsys, extra: list[str], suffix: str):
    """`generate` on tiny-v4.1 (random init, seed 4) eagerly, then with --cuda-graphs, each writing a trace →
    (eager stdout, graphed stdout, graphed stderr, eager trace, graphed trace)."""
    from engine.cli import main
    base = ["generate", "--config", "tiny-v4.1", "--random-init", "--seed", "4", *extra]
    assert main(base + ["--trace", str(tmp_path / f"eager{suffix}")]) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--cuda-graphs", "--trace", str(tmp_path / f"graphs{suffix}")]) == 0
    out, err = capsys.readouterr()
    return plain, out, err, Trace.load(tmp_path / f"eager{suffix}"), Trace.load(tmp_path / f"graphs{suffix}")


def test_cli_generate_with_cuda_graphs_writes_the_same_text_and_trace(tmp_path, capsys):
    plain, out, err, a, b = generate_with_and_without_graphs(
        tmp_path, capsys, ["--prompt", "The cat", "--max-new-tokens", "6"], ".safetensors")
    assert out == plain and "static decode body runs eagerly" in err
    assert [t.token_id for t in a.tokens(0)] == [t.token_id for t in b.tokens(0)]
    ids = [(p, q, v[0].tolist()) for p, _, _, q, v in a.facts("moe")]
    assert ids == [(p, q, v[0].tolist()) for p, _, _, q, v in b.facts("moe")] and len(ids) > 10 * 6


def test_cli_generate_with_cuda_graphs_and_dspark(tmp_path, capsys):
    """--cuda-graphs with --dspark (refused before graphed verify steps existed): same text, same DSpark steps."""
    plain, out, err, a, b = generate_with_and_without_graphs(
        tmp_path, capsys, ["--prompt", "x", "--dspark", "--max-new-tokens", "5"], ".json")
    assert out == plain and "DSpark:" in err
    assert [(s.anchor_pos, s.verify_len, s.accepted, s.next_token) for s in a.dspark_steps] == \
        [(s.anchor_pos, s.verify_len, s.accepted, s.next_token) for s in b.dspark_steps] and a.dspark_steps


def test_cli_bench_reports_graphed_decode(capsys):
    from engine.cli import main
    assert main(["bench", "--config", "tiny-v4.1", "--prompt-len", "4", "--new-tokens", "4", "--repeats", "1",
                 "--threads", "1", "--cuda-graphs", "--json"]) == 0
    import json
    rates = json.loads(capsys.readouterr().out)["cuda_graphs"]
    assert rates["captured"] is False and rates["decode_tokens_per_s"] > 0 and rates["decode_tokens_per_s_graphs"] > 0


# ---- DSpark verify steps through the GraphedDecoder (generate_speculative(cuda_graphs=True)) ---------------------
SPEC_V = 64   # a small vocabulary: random-init drafts are sometimes right, so acceptance and rejection both occur
SPEC_PROMPTS = [[0, 5, 7, 9, 11], [0, 10, 20], [0, 3, 3, 3, 3, 3, 3, 3, 3]]   # three lengths: rows at other positions


@pytest.fixture(scope="module")
def spec_model():
    return tiny_model(vocab_size=SPEC_V, dspark_noise_token_id=SPEC_V - 1)   # float64: exact comparisons


def _speculate(model, prompts, graphs, verifier=None, **kw):
    from engine.dspark.verify import verify
    from engine.generation.speculative import generate_speculative
    kw = {"max_new_tokens": 14, "seed": 0, "stop_tokens": (), **kw}
    return generate_speculative(model, prompts, GenerationRequest.of(cuda_graphs=graphs, **kw),
                                verifier=verifier or verify)


def _step_facts(steps):
    """Everything a list of DSpark steps decided (their wall times aside)."""
    return [(s.row, s.step, s.anchor_pos, s.anchor_token, s.drafted.tolist(), s.verify_len, s.accepted, s.next_token,
             s.next_kind) for s in steps]


@pytest.mark.slow  # four speculative runs, twice each [9 s]
@pytest.mark.parametrize("schedule", ["all", "threshold"])
@pytest.mark.parametrize("n_rows", [1, 3])
def test_greedy_dspark_with_graphs_equals_eager(spec_model, schedule, n_rows):
    from engine.generation import DSparkConfig
    cfg = DSparkConfig(schedule, threshold=0.6)
    eager, graphed = (_speculate(spec_model, SPEC_PROMPTS[:n_rows], g, dspark=cfg) for g in (False, True))
    assert graphed.tokens == eager.tokens and graphed.finish_reasons == eager.finish_reasons == ["length"] * n_rows
    assert _step_facts(graphed.steps) == _step_facts(eager.steps)
    assert [s.accepted for s in graphed.steps] == [s.accepted for s in eager.steps]
    assert eager.graphed_forwards == 0 and graphed.graphed_forwards == graphed.target_forwards == eager.target_forwards
    m, gamma = eager.metrics, spec_model.args.dspark_block_size
    assert 0 < m.accepted < m.scheduled                                     # both verdicts occurred
    if schedule == "threshold":   # blocks narrower than the graph's: the logits past ℓ really went unused
        assert any(s.verify_len < gamma for s in eager.steps)


def test_sampled_dspark_with_graphs_draws_the_same_random_numbers(spec_model):
    """T = 1, fixed seed: each row's generator is in the same state before and after every verification in
    both runs (so the drafter and the verifier drew the same numbers), and the tokens are identical."""
    from engine.dspark.verify import verify
    states = {False: [], True: []}

    def recording(graphs):
        def verifier(drafts, q, p, generator=None):
            states[graphs].append(generator.get_state())
            verdict = verify(drafts, q, p, generator=generator)
            states[graphs].append(generator.get_state())
            return verdict
        return verifier

    eager, graphed = (_speculate(spec_model, SPEC_PROMPTS, g, temperature=1.0, seed=11, verifier=recording(g))
                      for g in (False, True))
    assert graphed.tokens == eager.tokens and _step_facts(graphed.steps) == _step_facts(eager.steps)
    assert len(states[True]) == len(states[False]) == 2 * len(eager.steps) > 0
    assert all(torch.equal(a, b) for a, b in zip(states[False], states[True]))
    assert any(s.accepted for s in eager.steps) and any(s.next_kind == "replacement" for s in eager.steps)
    assert graphed.graphed_forwards == graphed.target_forwards


def test_a_compiled_decoders_first_step_is_set_apart_only_when_dynamo_compiles(monkeypatch):
    """GraphedDecoder.built marks the steps a run leaves out of its timings. Compiled bodies are the model's, shared
    by every decoder: a new decoder's first step of a bucket is slow only if dynamo compiles a graph for it (its
    counter moves), so the next run's first steps are timed; without compile the first step of a bucket is the
    layout (a capture on CUDA), always set apart. (The body runs eagerly here: no compile, only the rule.)"""
    from engine.graphs import compiled_body as compiled_module
    from engine.graphs import decoder as decoder_module
    compiled = [0]
    monkeypatch.setattr(decoder_module, "compiled_body", lambda model: decode_body)
    monkeypatch.setattr(compiled_module, "graphs_compiled", lambda: compiled[0])
    model = tiny_model()
    prompts = _prompts()
    with torch.inference_mode():
        firsts = []
        for compiles_now in (True, False):
            cache = model.new_cache(len(prompts) + 1, 64)
            nxt = _prefill(model, cache, prompts)
            decoder = GraphedDecoder(model, cache, scratch_row=len(prompts), compile=True)
            real = decoder._run

            def run(st, real=real, compiles_now=compiles_now):
                real(st)
                compiled[0] += int(compiles_now and not firsts)    # dynamo compiles on the first run's first step
            monkeypatch.setattr(decoder, "_run", run)
            decoder.step(nxt, list(range(len(prompts))))
            firsts.append(decoder.built)
            decoder.step(nxt, list(range(len(prompts))))
            assert not decoder.built                                # the bucket's later steps: never
        assert firsts == [True, False]
        eager = GraphedDecoder(model, model.new_cache(2, 64), scratch_row=1, capture=False)
        eager.step(torch.tensor([[5]]), [0])
        assert eager.built                                          # a layout run, as before
        eager.step(torch.tensor([[6]]), [0])
        assert not eager.built


def test_a_compiled_drafters_first_draft_is_set_apart_only_when_dynamo_compiles(spec_model, monkeypatch):
    """GraphedDrafter.built follows the decoder's rule (the test above): with compile, a new drafter's first draft
    of a bucket is set apart only if dynamo's counter moves; without, the first draft of a bucket always is."""
    from engine.graphs import GraphedDrafter
    from engine.graphs import compiled_body as compiled_module
    from engine.graphs import drafter as drafter_module
    from engine.graphs.draft_body import draft_body
    from engine.request.sampling import SamplingParams
    compiled = [0]
    monkeypatch.setattr(drafter_module, "compiled_draft_body", lambda model: draft_body)
    monkeypatch.setattr(compiled_module, "graphs_compiled", lambda: compiled[0])
    built = []
    with torch.inference_mode():
        for compiles_now in (True, False, None):                  # None: no compile
            drafter = GraphedDrafter(spec_model, _draft_state(spec_model, 1, True), compile=compiles_now is not None)
            real = drafter._run

            def run(st, real=real, compiles_now=compiles_now):
                real(st)
                compiled[0] += int(bool(compiles_now))
            monkeypatch.setattr(drafter, "_run", run)
            for _ in range(2):
                drafter.draft([0], torch.tensor([3]), SamplingParams(), [None])
                built.append(drafter.built)
    assert built == [True, True, False, False, True, False]


@pytest.mark.slow  # torch.compile of the verify and draft bodies [~3-4 min cold]
def test_compiled_dspark_equals_eager_without_graph_breaks(spec_model):
    """generate_speculative(compiled=True): the verify blocks and the drafts through torch.compile decide every step
    as the eager run does (float64: no rounding can tie two logits), and dynamo traces both bodies whole — a graph
    break would hand ops back to Python between compiled pieces; a later run of another length compiles nothing new.
    Slow: compiling takes minutes on a small CPU."""
    from torch._dynamo.utils import counters

    from engine.generation import DSparkConfig
    cfg = DSparkConfig("all")
    eager = _speculate(spec_model, SPEC_PROMPTS[:1], False, dspark=cfg)
    counters.clear()
    compiled = _speculate(spec_model, SPEC_PROMPTS[:1], False, dspark=cfg, compiled=True)
    assert dict(counters["graph_break"]) == dict(counters["unimplemented"]) == {}
    assert counters["stats"]["unique_graphs"] >= 2
    assert compiled.tokens == eager.tokens and _step_facts(compiled.steps) == _step_facts(eager.steps)
    assert compiled.graphed_forwards == compiled.target_forwards == compiled.graphed_drafts == len(eager.steps)
    graphs = counters["stats"]["unique_graphs"]   # a shorter run's cache falls in the same length bucket: no compile
    shorter = _speculate(spec_model, SPEC_PROMPTS[:1], False, dspark=cfg, compiled=True, max_new_tokens=9)
    assert counters["stats"]["unique_graphs"] == graphs and shorter.tokens[0] == eager.tokens[0][:9]
    m = eager.metrics
    assert 0 < m.accepted < m.scheduled                                     # both verdicts occurred


@pytest.mark.slow  # traced DSpark runs twice, two cases [5 + 3 s]
@pytest.mark.parametrize("max_tokens, prompts", [(None, [[0, 10], [0, 7, 21]]), (40, SPEC_PROMPTS)],
                         ids=["short-prompts", "budget"])
def test_dspark_trace_with_graphs_equals_eager(spec_model, max_tokens, prompts):
    """moe/mhc/engram/attention/lens facts, tokens and DSpark steps after rollback equal the eager run's. The
    graphed step hands the trace only the scheduled block's records (trace_tokens), so short prompts (fewer
    visible compressed rows than index_topk) get the eager top-k widths, and a token budget that runs out
    mid-run fills the same slots and counts the same omissions."""
    from engine.generation import DSparkConfig
    traces = []
    for graphs in (False, True):
        trace = Trace(TraceBudget(max_tokens=max_tokens, attention=True, lens=True))
        _speculate(spec_model, prompts, graphs, max_new_tokens=10, dspark=DSparkConfig("threshold", 0.6),
                   trace=trace)
        traces.append(trace)
    eager, graphed = traces
    _assert_same_facts(_fact_lists(eager), _fact_lists(graphed))
    assert graphed.summary()["token_slots"] == eager.summary()["token_slots"]
    assert graphed.omitted == eager.omitted and (max_tokens is None) == (not eager.omitted)
    assert _step_facts(graphed.dspark_steps) == _step_facts(eager.dspark_steps) and eager.dspark_steps
    for row in range(len(prompts)):
        a, b = eager.tokens(row), graphed.tokens(row)
        assert [(t.pos, t.token_id, t.generated, t.step) for t in a] == [(t.pos, t.token_id, t.generated, t.step)
                                                                         for t in b]
        assert all(np.array_equal(x.top_ids, y.top_ids) for x, y in zip(a, b))


@pytest.mark.slow  # the same up to max_seq_len [7 s]
def test_dspark_with_graphs_at_the_model_and_cache_end(spec_model, monkeypatch):
    """Rows that run into the model's max_seq_len end as in the eager run; and a cache without the spare
    positions leaves the last steps too little room for a full graphed block: they run eagerly, same tokens."""
    short = tiny_model(vocab_size=SPEC_V, dspark_noise_token_id=SPEC_V - 1, max_seq_len=20)
    eager, graphed = (_speculate(short, SPEC_PROMPTS, g, max_new_tokens=30) for g in (False, True))
    assert graphed.tokens == eager.tokens and graphed.finish_reasons == eager.finish_reasons
    assert set(eager.finish_reasons) == {"max_seq_len"} and len(SPEC_PROMPTS[2]) + len(eager.tokens[2]) == 20
    assert graphed.graphed_forwards == graphed.target_forwards   # the γ + 1 spare positions always fit a block

    gamma, build = spec_model.args.dspark_block_size, type(spec_model).new_cache
    monkeypatch.setattr(spec_model, "new_cache", lambda rows, length: build(spec_model, rows, length - gamma - 1))
    prompt = SPEC_PROMPTS[:1]
    eager = _speculate(spec_model, prompt, False, max_new_tokens=16)
    graphed = _speculate(spec_model, prompt, True, max_new_tokens=16)
    assert graphed.tokens == eager.tokens and graphed.finish_reasons == ["length"]
    assert _step_facts(graphed.steps) == _step_facts(eager.steps)
    assert 0 < graphed.graphed_forwards < graphed.target_forwards       # the tail fell back to eager steps


# ---- DSpark draft steps through the GraphedDrafter -----------------------------------------------------------------
def _draft_state(model, n_rows, graphs):
    """Drafter rings (plus a scratch row when graphed) after rows prefilled with taps of different lengths."""
    from engine.dspark.drafter_cache import DrafterCache
    margin = model.args.dspark_block_size + 1
    rings = DrafterCache(model, n_rows + 1 if graphs else n_rows, margin)
    gen = torch.Generator().manual_seed(1)
    n_taps = len(model.args.dspark_target_layer_ids) * model.args.dim
    with torch.inference_mode():
        for r in range(n_rows):
            taps = torch.randn(1, 3 + 4 * r, n_taps, generator=gen, dtype=model.dtype)     # [1, S, n_taps·dim]
            rings.append(model, taps.to(model.device), [r])
    return rings


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
@pytest.mark.parametrize("n_rows", [1, 3])
def test_graphed_draft_equals_eager_draft_over_steps_and_rollbacks(spec_model, n_rows, temperature):
    """12 draft steps (rows at different positions; for 3 rows the live sets [0, 1, 2] (a padded bucket of 4),
    [2, 0] and [1]), each followed by a verify-width append of taps and a rollback to a random accepted prefix:
    tokens, q, confidences, every generator's state and the mtp.* moe/mhc trace facts equal the eager drafter's."""
    from engine.dspark.drafter import draft
    from engine.graphs import GraphedDrafter
    from engine.model.sampling import make_generators
    from engine.request.sampling import SamplingParams
    model, gamma = spec_model, spec_model.args.dspark_block_size
    params = SamplingParams(temperature, top_k=40 if temperature else 0)
    rings_e, rings_g = _draft_state(model, n_rows, False), _draft_state(model, n_rows, True)
    scratch_before = {k: v[n_rows].clone() for k, v in rings_g.rings.items()}
    drafter = GraphedDrafter(model, rings_g)                                  # scratch row: n_rows
    gens_e, gens_g = make_generators(list(range(n_rows)), "cpu"), make_generators(list(range(n_rows)), "cpu")
    traces = [Trace(TraceBudget(max_tokens=None)) for _ in range(2)]
    gen = torch.Generator().manual_seed(2)
    n_taps = len(model.args.dspark_target_layer_ids) * model.args.dim
    with torch.inference_mode():
        for step in range(12):
            rows = [[0, 1, 2], [2, 0], [1]][step % 3] if n_rows == 3 else [0]
            anchors = torch.randint(0, SPEC_V, (len(rows),), generator=gen)
            want = draft(model, rings_e, torch.tensor(rows), anchors, params, [gens_e[r] for r in rows], traces[0])
            got = drafter.draft(rows, anchors, params, [gens_g[r] for r in rows], traces[1])
            assert torch.equal(got.tokens, want.tokens), step
            assert got.tokens.dtype == torch.long and got.tokens.shape == (len(rows), gamma)
            torch.testing.assert_close(got.confidence_logits, want.confidence_logits, rtol=0, atol=1e-12)
            if params.greedy:
                assert got.q is None and want.q is None
            else:
                torch.testing.assert_close(got.q, want.q, rtol=0, atol=1e-12)
            assert all(torch.equal(gens_e[r].get_state(), gens_g[r].get_state()) for r in rows)
            # the verify forward's taps for anchor + γ drafts, then the rollback to the accepted prefix
            taps = torch.randn(len(rows), gamma + 1, n_taps, generator=gen, dtype=model.dtype)
            keep = rings_e.pos[rows] + 1 + torch.randint(0, gamma + 1, (len(rows),), generator=gen)
            for rings in (rings_e, rings_g):
                rings.append(model, taps, rows)
                rings.rollback(keep, rows)
    assert int(rings_e.pos.max()) > rings_e.slots                           # the rings wrapped
    assert torch.equal(rings_e.pos, rings_g.pos[:n_rows]) and int(rings_g.pos[n_rows]) == 0
    assert all(torch.equal(scratch_before[k], rings_g.rings[k][n_rows]) for k in scratch_before)
    assert sorted({b for b, _, _ in drafter._buckets}) == ([1, 2, 4] if n_rows == 3 else [1])
    for kind in ("moe", "mhc"):
        eager, graphed = traces[0].facts(kind), traces[1].facts(kind)
        assert len(eager) == len(graphed) > 0 and all(p.startswith("mtp.") for p, *_ in eager)
        for (p1, s1, r1, q1, v1), (p2, s2, r2, q2, v2) in zip(eager, graphed):
            assert (p1, s1, r1, q1) == (p2, s2, r2, q2)
            for a, b in zip(v1, v2, strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype
                if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
                    assert np.array_equal(a, b), (kind, p1)
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # DSpark through graphed bodies [11 s]
def test_dspark_with_graphs_drafts_through_the_graphed_drafter(spec_model):
    """Every speculative step's draft goes through the GraphedDrafter, greedy and sampled, same tokens and steps."""
    for kw in ({}, {"temperature": 1.0, "seed": 5}):
        eager, graphed = (_speculate(spec_model, SPEC_PROMPTS, g, **kw) for g in (False, True))
        assert graphed.tokens == eager.tokens and _step_facts(graphed.steps) == _step_facts(eager.steps)
        np.testing.assert_allclose(np.stack([s.confidences for s in graphed.steps]),
                                   np.stack([s.confidences for s in eager.steps]), rtol=0, atol=1e-6)
        np.testing.assert_allclose(np.stack([s.draft_probs for s in graphed.steps]),
                                   np.stack([s.draft_probs for s in eager.steps]), rtol=0, atol=1e-6)
        assert eager.graphed_drafts == 0 and graphed.graphed_drafts == graphed.target_forwards == eager.target_forwards


@pytest.mark.parametrize("greedy", [True, False])
def test_meta_proxy_passes_the_draft_body(greedy):
    from engine.graphs import check_draft_capture_safe
    args = load_config(TINY)
    check_draft_capture_safe(args, batch=2, greedy=greedy)
    check_draft_capture_safe(args, batch=4, trace=False, dtype=torch.float32, greedy=greedy)


def _draft_item_body(model, rings, inputs, trace=None, greedy=True):
    from engine.graphs import draft_body
    draft_body(model, rings, inputs, trace, greedy)
    int(inputs.tokens[0, 0])                                                 # a deliberate host sync


def _draft_eager_context_body(model, rings, inputs, trace=None, greedy=True):
    """The eager drafter's context (static off): its trace rows are read back to the host."""
    from engine.dspark.drafter import draft_forward
    from engine.model.draft import DraftContext
    ring_rows = {layer: ring.index_select(0, inputs.rows) for layer, ring in rings.rings.items()}
    ctx = DraftContext(rows=inputs.rows, positions=inputs.positions, rings=ring_rows, ring_index=inputs.ring_index,
                       trace=trace)
    draft_forward(model, inputs.ids, ctx)


def _draft_live_rows_body(model, rings, inputs, trace=None, greedy=True):
    """Dropping the padding rows by value: a shape that depends on the rows' values."""
    from engine.graphs import draft_body
    draft_body(model, rings, inputs, trace, greedy)
    inputs.base[inputs.rows != inputs.scratch_row].sum()


@pytest.mark.parametrize("body", [_draft_item_body, _draft_eager_context_body, _draft_live_rows_body])
def test_meta_proxy_catches_a_host_sync_in_the_draft_body(body):
    from engine.graphs import check_draft_capture_safe
    with pytest.raises(CaptureUnsafeError, match="draft body is not capture-safe"):
        check_draft_capture_safe(load_config(TINY), batch=2, body=body)


def test_graphed_drafter_refuses_misuse_clearly(spec_model):
    from engine.graphs import GraphedDrafter
    from engine.request.sampling import SamplingParams
    rings = _draft_state(spec_model, 2, True)
    with pytest.raises(ValueError, match="capture=True needs the model on a CUDA device"):
        GraphedDrafter(spec_model, rings, capture=True)
    with pytest.raises(ValueError, match="scratch_row 3 outside"):
        GraphedDrafter(spec_model, rings, scratch_row=3)
    drafter = GraphedDrafter(spec_model, rings)
    with pytest.raises(RuntimeError, match="no_grad"):
        drafter.draft([0], torch.tensor([1]), SamplingParams(), [None])
    with torch.inference_mode():
        with pytest.raises(ValueError, match="scratch row"):
            drafter.draft([0, 2], torch.tensor([1, 2]), SamplingParams(), [None, None])
        with pytest.raises(ValueError, match="2 anchors for 1 rows"):
            drafter.draft([0], torch.tensor([1, 2]), SamplingParams(), [None])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: captures and replays the draft body "
                                                          "(run by scripts/gpu_check.sh on a GPU)")
def test_cuda_graph_capture_of_the_draft_step_matches_eager():
    from engine.dspark.drafter import draft
    from engine.graphs import GraphedDrafter
    from engine.model.sampling import make_generators
    from engine.request.sampling import SamplingParams
    torch.manual_seed(0)
    model = tiny_model(dtype=torch.float32, vocab_size=SPEC_V, dspark_noise_token_id=SPEC_V - 1).cuda()
    rings_e, rings_g = _draft_state(model, 3, False), _draft_state(model, 3, True)
    drafter = GraphedDrafter(model, rings_g)
    assert drafter.capture
    for params in (SamplingParams(), SamplingParams(1.0)):
        gens_e, gens_g = make_generators([0, 1, 2], "cuda"), make_generators([0, 1, 2], "cuda")
        with torch.inference_mode():
            for step in range(6):
                rows = [[0, 1, 2], [2, 0], [1]][step % 3]
                anchors = torch.tensor([5, 9, 11][:len(rows)])
                want = draft(model, rings_e, torch.tensor(rows), anchors, params, [gens_e[r] for r in rows])
                got = drafter.draft(rows, anchors, params, [gens_g[r] for r in rows])
                torch.testing.assert_close(got.confidence_logits, want.confidence_logits, rtol=1e-3, atol=1e-3)
                assert (got.tokens == want.tokens).float().mean() >= 0.8
    assert drafter.captured == [1, 2, 4]
