"""Logit lens and residual-stream RMS: recorded per layer and token by the prepared engine (V4.1 and V4), equal to a
direct computation (the model cut after that layer), exact at the last layer, kept out by the budget, and saved."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from engine.generation import DSparkConfig, Engine
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget, load_trace, save_trace

torch.set_num_threads(1)   # small ops on the shared 2-core machine: one thread each (see tests/model_helpers.py)
PROMPT = [0, 17, 4242, 99, 31337, 5]
NEW = 6


@pytest.fixture(scope="module", params=["tiny-v4.1", "tiny-v4"])
def engine(request) -> Engine:
    """The engine as the app builds it (Engine.load: random init, prepared by engine.speedups)."""
    return Engine.load(request.param)


@pytest.fixture(scope="module")
def recorded(engine) -> tuple[Trace, list[int]]:
    """A greedy generation's trace with the lens on, and the whole token sequence (read only by the tests)."""
    return lens_trace(engine)


def lens_trace(engine: Engine, **budget) -> tuple[Trace, list[int]]:
    trace = Trace(TraceBudget(**{"lens": True, "top_k_logits": 5, **budget}))
    result = engine.generate([PROMPT], GenerationRequest.of(NEW, trace=trace))
    return trace, PROMPT + result.tokens[0]


def lens_grid(trace: Trace, path: str, positions) -> dict[str, np.ndarray]:
    """The lens records of one layer at the given positions, field by field ([len(positions), ...])."""
    recs = [trace.fact("lens", path, 0, p) for p in positions]
    assert all(r is not None for r in recs), path
    return {k: np.stack([r[k] for r in recs]) for k in recs[0]}


def test_the_engine_is_prepared_and_records_every_layer_and_token(engine, recorded):
    assert type(engine.model).__name__ == "FastTransformer"   # the speed transforms are what the lens runs on
    trace, seq = recorded
    paths = [f"layers.{i}" for i in range(engine.args.n_layers)]
    assert trace.paths("lens") == paths
    forwarded = list(range(len(seq) - 1))      # the last generated token is never fed back
    for path in paths:
        assert sorted(pos for p, _, _, pos, _ in trace.facts("lens") if p == path) == forwarded
    rec = lens_grid(trace, paths[-1], forwarded)
    assert rec["top_ids"].shape == (len(forwarded), 5) and rec["rms_in"].shape == (len(forwarded), 4)
    assert (rec["next_id"] == seq[1:]).all()   # each position's next token: the prompt's, then the generated
    assert (rec["next_rank"][len(PROMPT) - 1:] == 1).all()   # greedy: the model's own top token at the last layer
    assert trace.summary()["records"]["lens"] == len(paths) * len(forwarded)


def test_the_last_layer_is_the_models_own_prediction(engine):
    """The lens at the last layer reads out the same hidden state the logits come from: top-k ids equal the
    model's, probabilities within fp32 rounding (only the matmul's batch differs)."""
    model = engine.model
    tokens = torch.tensor([PROMPT])
    trace = Trace(TraceBudget(lens=True, top_k_logits=8))
    trace.record_prompt(0, PROMPT, [f"t{i}" for i in PROMPT])   # (the lens reads each position's next token here)
    with torch.inference_mode():
        logits = model(tokens, trace=trace, logits="all").logits[0]                 # [S, V]
    probs = torch.softmax(logits, -1)
    last = f"layers.{engine.args.n_layers - 1}"
    rec = lens_grid(trace, last, range(len(PROMPT) - 1))
    top = torch.topk(logits[:-1], 8)
    assert np.array_equal(rec["top_ids"], top.indices.numpy())
    diff = np.abs(rec["top_probs"] / probs[:-1].gather(-1, top.indices).numpy() - 1).max()
    assert diff <= 1e-5, f"largest relative difference of a top-8 probability: {diff:.2e}"   # fp32 rounding
    nxt = torch.tensor(PROMPT[1:])
    assert np.allclose(rec["next_prob"], probs[:-1].gather(-1, nxt[:, None])[:, 0].numpy(), rtol=1e-5, atol=0)
    # the rank, up to logits that tie the next token's within fp32 rounding of the two matmuls
    target, tol = logits[:-1].gather(-1, nxt[:, None]), 1e-6 * logits.abs().max()
    fewest = (logits[:-1] > target + tol).sum(-1) + 1
    most = (logits[:-1] > target - tol).sum(-1) + 1
    assert np.all((fewest.numpy() <= rec["next_rank"]) & (rec["next_rank"] <= most.numpy()))
    assert (most - fewest).max() <= 8, (most - fewest).tolist()        # a narrow band: rounding, not a loose test
    assert trace.fact("lens", last, 0, len(PROMPT) - 1)["next_id"] == -1   # nothing followed the last position


def test_every_layer_equals_the_model_cut_after_it(engine):
    """Layer i's lens is what a model of only layers 0..i outputs (its read-out is the model's own final one: V4.1
    collapses with layer i's ffn pre, V4 with hc_head); the RMS tracks equal the block's input and output streams."""
    model = engine.model
    tokens = torch.tensor([PROMPT])
    trace = Trace(TraceBudget(lens=True, top_k_logits=5))
    streams: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [layer.register_forward_hook(lambda m, args, out: streams.__setitem__(m.path, (args[0], out[0])))
             for layer in model.layers]
    try:
        with torch.inference_mode():
            model(tokens, trace=trace, logits="all")
    finally:
        for h in hooks:
            h.remove()
    full = model.layers
    worst = 0.0
    try:
        for i in range(len(full)):
            model.layers = nn.ModuleList(full[: i + 1])
            with torch.inference_mode():
                probs = torch.softmax(model(tokens, logits="all").logits[0, :-1], -1)   # [S-1, V]
            rec = lens_grid(trace, f"layers.{i}", range(len(PROMPT) - 1))
            top = torch.topk(probs, 5)
            assert np.array_equal(rec["top_ids"], top.indices.numpy()), i
            worst = max(worst, float((np.abs(rec["top_probs"] / top.values.numpy() - 1)).max()))
            h_in, h_out = streams[f"layers.{i}"]
            for name, h in (("rms_in", h_in), ("rms_out", h_out)):
                rms = h[0, :-1].float().square().mean(-1).sqrt().numpy()            # [S-1, hc]
                assert np.allclose(rec[name], rms, rtol=1e-5), (i, name)
    finally:
        model.layers = full
    assert worst <= 1e-5, f"largest relative difference of a top-5 probability: {worst:.2e}"   # fp32 rounding


def test_budget_off_records_nothing_and_changes_nothing(engine):
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        plain = engine.model(tokens, logits="all").logits
        off, on = Trace(TraceBudget()), Trace(TraceBudget(lens=True))
        with_off = engine.model(tokens, trace=off, logits="all").logits
        with_on = engine.model(tokens, trace=on, logits="all").logits
    assert torch.equal(plain, with_off) and torch.equal(plain, with_on)   # bit for bit
    assert off.paths("lens") == [] and "lens" not in off.summary()["records"]
    assert on.paths("lens")
    a = engine.generate([PROMPT], GenerationRequest.of(NEW, trace=Trace(TraceBudget())))
    b = engine.generate([PROMPT], GenerationRequest.of(NEW, trace=Trace(TraceBudget(lens=True))))
    assert a.tokens == b.tokens


def test_layer_and_token_budgets_apply(engine):
    trace, _ = lens_trace(engine, layers=frozenset({0, 2}), max_tokens=4)
    assert trace.paths("lens") == ["layers.0", "layers.2"]
    assert sorted({pos for *_, pos, _ in trace.facts("lens")}) == [0, 1, 2, 3]
    assert trace.omitted["lens"] == 2 * (len(PROMPT) + NEW - 1 - 4)   # the refused tokens, per kept layer
    assert "lens_hidden" not in trace.omitted


def test_speculative_and_graphed_decoding_record_the_same_lens(engine, recorded):
    """DSpark's verify forwards record drafts that are later rolled back; the static (CUDA-graph) decode body
    records through its trace buffers: both leave the lens of the plain run (to float rounding)."""
    plain, seq = recorded
    for kwargs in ({"cuda_graphs": True}, {"dspark": DSparkConfig()}):
        trace = Trace(TraceBudget(lens=True, top_k_logits=5))
        result = engine.generate([PROMPT], GenerationRequest.of(NEW, trace=trace, **kwargs))
        assert PROMPT + result.tokens[0] == seq, kwargs
        if "dspark" in kwargs:   # drafts were rejected, so recorded positions were rolled back
            assert any(s.accepted < s.verify_len for s in trace.dspark_steps)
        assert [f[:4] for f in trace.facts("lens")] == [f[:4] for f in plain.facts("lens")], kwargs
        for (*_, a), (*_, b) in zip(trace.facts("lens"), plain.facts("lens")):
            assert a[2] == b[2] and a[3] == b[3]                     # next token and its rank
            assert np.allclose(a[1], b[1], rtol=1e-4, atol=1e-7) and np.allclose(a[6], b[6], rtol=1e-4)


def test_round_trip_through_trace_files(recorded, tmp_path):
    trace, _ = recorded
    path = trace.paths("lens")[-1]
    for name in ("t.json", "t.parquet.zip", "t.safetensors"):
        back = load_trace(save_trace(trace, tmp_path / name))
        assert back == trace and back.summary() == trace.summary(), name
        assert np.array_equal(back.fact("lens", path, 0, 3)["top_ids"], trace.fact("lens", path, 0, 3)["top_ids"])
        back.fact("lens", path, 0, 3)["rms_out"][0] += 1e-6
        assert back != trace, name                                    # the lens takes part in the equality


def test_a_trace_written_before_the_lens_still_loads(engine, tmp_path):
    trace, _ = lens_trace(engine, lens=False)
    body = json.loads(save_trace(trace, tmp_path / "new.json").read_text())
    del body["tables"]["lens"], body["header"]["schema"]["lens"], body["header"]["n_rows"]["lens"]
    del body["header"]["budget"]["lens"]
    (tmp_path / "old.json").write_text(json.dumps(body))
    assert load_trace(tmp_path / "old.json") == trace


def test_the_cli_records_the_lens_on_request(tmp_path, capsys):
    from engine.cli import main
    base = ["generate", "--prompt", "The cat", "--max-new-tokens", "3", "--config", "tiny-v4", "--random-init"]
    assert main(base + ["--trace", str(tmp_path / "lens.parquet.zip"), "--trace-lens"]) == 0
    assert main(base + ["--trace", str(tmp_path / "plain.parquet.zip")]) == 0
    capsys.readouterr()
    lens, plain = load_trace(tmp_path / "lens.parquet.zip"), load_trace(tmp_path / "plain.parquet.zip")
    assert lens.budget.lens and lens.paths("lens") == [f"layers.{i}" for i in range(7)]
    assert not plain.budget.lens and plain.paths("lens") == []
    assert [t.token_id for t in lens.tokens(0)] == [t.token_id for t in plain.tokens(0)]
