"""Inspect panel builders on a real trace from short generations of tiny-v4.1 (random weights, DSpark, attention)."""
from __future__ import annotations

import html
import threading

import numpy as np
import pytest

from engine.trace import Trace, TraceFormatError
from v41viz.inspect import attention_panel, dspark_panel, engram_panel, experts_panel, lens_panel, mhc_panel
from v41viz.inspect.equivalent import missing_reason, nearest_equivalent
from v41viz.inspect.export import FORMATS, trace_bytes, trace_from_upload
from v41viz.inspect.links import diagram_node, filter_path, mhc_site, panel_for, related
from v41viz.inspect.run import (
    GenSettings,
    LiveRun,
    generate_into,
    new_trace,
    prompt_problem,
    settings_of,
    status_sentence,
)
from v41viz.inspect.tokens import alternatives, chosen_by, probability_text, token_detail_html, token_table, visible
from v41viz.inspect.trace_model import TEXTS, record_texts, shown_text, text_lookup, trace_model
from v41viz.inspect.url import InspectLink, link_params, parse_link, prompt_id
from v41viz.ui import engine_session

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def slot():
    return engine_session.load_slot(engine_session.model_choices()["tiny-v4.1"])


def _run(slot, **kw) -> LiveRun:
    settings = GenSettings(PROMPT, **{"max_new_tokens": 8, **kw})
    run = LiveRun(new_trace(settings, "tiny-v4.1", slot.engine.source), "tiny-v4.1", prompt=PROMPT)
    with slot.turn() as engine:
        generate_into(engine, settings, run, lambda r, p: None)
    return run


def test_the_decoding_options_reach_the_engine_and_the_trace(slot):
    ids = slot.engine.encode_prompt(PROMPT)
    changed = _run(slot, repetition_penalty=0.3, no_repeat_ngram=2)   # below 1: the history's tokens come back
    want = slot.engine.generate([ids], max_new_tokens=8, repetition_penalty=0.3, no_repeat_ngram=2).tokens[0]
    assert [t.token_id for t in changed.trace.tokens(0) if t.generated] == want
    recorded = settings_of(changed.trace.meta)
    assert (recorded["repetition_penalty"], recorded["no_repeat_ngram"]) == (0.3, 2)
    off = _run(slot, repetition_penalty=1.0, no_repeat_ngram=0)
    assert [t.token_id for t in off.trace.tokens(0) if t.generated] == \
        slot.engine.generate([ids], max_new_tokens=8).tokens[0] != want
    # a generated token's line says how the run chose it; its probability is the model's own, before the options
    last = len(ids) + 7
    assert "(chosen greedily with repetition penalty 0.3 and no repeated 2-grams)" in \
        token_detail_html(changed.trace, 0, last, slot.engine.tokenizer.token_text)
    assert "(chosen greedily)" in token_detail_html(off.trace, 0, last, slot.engine.tokenizer.token_text)
    assert chosen_by({"temperature": 0.8, "repetition_penalty": 1.0, "no_repeat_ngram": 3}) == \
        "sampled at temperature 0.8 with no repeated 3-grams"


@pytest.fixture(scope="module")
def plain(slot):
    return _run(slot, attention=True)


@pytest.fixture(scope="module")
def spec(slot):
    return _run(slot, dspark=True, schedule="threshold", threshold=0.3, attention=False)


def test_run_streams_the_same_text_as_the_engine(slot, plain):
    ref = slot.engine.generate_text(PROMPT, max_new_tokens=8, seed=0)
    assert plain.status == "done" and plain.n_tokens == len(ref.result.tokens[0]) == 8
    assert plain.text == ref.texts[0]
    assert 0 < plain.first_token_s <= plain.elapsed_s


def test_speculative_greedy_matches_plain_greedy(plain, spec):
    assert spec.text == plain.text            # DSpark is lossless at temperature 0
    assert spec.trace.dspark_steps and not plain.trace.dspark_steps


def test_expert_heatmap_shows_each_tokens_choices(plain):
    trace = plain.trace
    fig = experts_panel.choice_heatmap(trace)
    hm = fig.data[0]
    paths = experts_panel.moe_paths(trace)
    assert list(hm.y) == paths and len(paths) == 10      # plain decoding runs no draft stage
    positions, ids, weights, _ = experts_panel.choice_grid(trace, 0, paths)
    assert len(hm.x) == len(positions) == 4 + 1 + 7      # BOS + 4 prompt tokens + 7 decoded (the last is not fed back)
    rec = trace.fact("moe", paths[3], 0, positions[2])
    assert hm.text[3][2] == ",".join(map(str, rec["ids"]))
    assert hm.z[3][2] == rec["ids"][np.argmax(rec["weights"])]
    assert "weight" in hm.customdata[3][2] and "score" in hm.customdata[3][2]
    assert experts_panel.moe_paths(trace, "layers.1") == ["layers.1.ffn"]


def test_load_is_relative_to_uniform(plain, slot):
    e, k = slot.args.n_routed_experts, slot.args.n_activated_experts
    table = experts_panel.load_table(plain.trace, ["layers.0.ffn", "layers.5.ffn"], e)
    ratios = table[[f"e{i}" for i in range(e)]].to_numpy()
    assert np.allclose(ratios.mean(1), 1.0)                # the mean load is the uniform load
    assert (table["tokens×k"] == 12 * k).all()
    assert table["max/uniform"].min() >= 1.0


def test_measured_experts_touched(plain, slot):
    e, k = slot.args.n_routed_experts, slot.args.n_activated_experts
    m = experts_panel.measured_touched(plain.trace)
    assert list(m) == [1, 2, 4, 8] and m[1] == k          # top-k experts of one token are distinct
    values = list(m.values())
    assert all(a <= b for a, b in zip(values, values[1:])) and values[-1] <= e


def test_token_topk_sorted_by_weight(plain):
    t = experts_panel.token_topk(plain.trace, 0, 3)
    assert len(t) == 10
    for w in t["weights"]:
        assert list(w) == sorted(w, reverse=True)
    rec = plain.trace.fact("moe", "layers.2.ffn", 0, 3)
    assert set(t.set_index("layer").loc["layers.2.ffn", "experts"]) == set(rec["ids"].tolist())


def test_mhc_matrix_gain_and_residuals(plain):
    trace = plain.trace
    fig = mhc_panel.matrix_figure(trace, "layers.4", "ffn", 0, 2)
    assert np.allclose(np.array(fig.data[0].z), trace.mhc_matrix("layers.4", "ffn", 0, 2))
    gains = mhc_panel.gain_by_depth(trace, 0, 2)
    assert len(gains) == 20 and gains["seam"].iloc[0] == "layers.0.attn"
    c0 = trace.mhc_matrix("layers.0", "attn", 0, 2)
    assert gains["gain"].iloc[0] == pytest.approx(max(c0.sum(0).max(), c0.sum(1).max()))
    assert np.allclose(gains["gain"], 1.0, atol=1e-3)       # products of doubly stochastic matrices
    _, composite_gain = trace.mhc_composite(0, 2)
    assert gains["gain"].iloc[-1] == pytest.approx(composite_gain)
    res = mhc_panel.residual_table(trace)
    assert len(res) == 2 * len(trace.paths("mhc")) and (res["max row residual"] < 1e-3).all()
    pre = mhc_panel.pre_post_figure(trace, "layers.4", "attn", 0, 2)
    assert len(pre.data) == 2 and len(pre.data[0].y) == 4


def test_engram_rows_gates_and_text(plain, slot):
    trace, args = plain.trace, slot.args
    assert engram_panel.engram_paths(trace) == ["layers.1.engram", "layers.4.engram"]
    table = engram_panel.rows_table(trace, args, "layers.4.engram", 0, 3)
    assert list(table.index) == ["2-gram", "3-gram", "4-gram"] and table.shape == (3, args.engram_n_heads)
    assert table.to_numpy().reshape(-1).tolist() == trace.fact("engram", "layers.4.engram", 0, 3)["row_ids"].tolist()
    positions, gates = engram_panel.gate_grid(trace, "layers.1.engram")
    assert gates.shape == (len(positions), args.hc_mult) and ((gates >= 0) & (gates <= 1)).all()
    page = engram_panel.gated_text_html(trace, "layers.1.engram")
    for t in trace.tokens(0):
        assert html.escape(t.text) in page
    assert f"{gates[2].mean():.3f}" in page
    summary = engram_panel.token_summary(trace, "layers.1.engram")
    assert summary["compressed id"].iloc[1] == int(trace.fact("engram", "layers.1.engram", 0, 1)["compressed_ids"])


def test_dspark_views_agree_with_the_steps(spec, slot):
    trace = spec.trace
    steps = dspark_panel.steps(trace)
    for s in steps:
        v = dspark_panel.verdicts(s)
        assert v.count("accepted") == s.accepted
        assert v.count("rejected") == (1 if s.accepted < s.verify_len else 0)
        assert v.count("not verified") == len(s.drafted) - s.accepted - v.count("rejected")
        assert v[:s.accepted] == ["accepted"] * s.accepted
    hist = dspark_panel.accepted_histogram(trace).data[0]
    assert sum(hist.y) == len(steps)
    m = dspark_panel.metrics(trace, 0)
    assert m.mean_accepted_length == pytest.approx(np.mean([s.accepted + 1 for s in steps]))
    page = dspark_panel.steps_html(trace, slot.engine.tokenizer.token_text)
    assert page.count("<div><b>step") == len(steps) and dspark_panel.VERDICT_COLOURS["not verified"] in page
    newline = dspark_panel.steps_html(trace, lambda t: "\n<")   # every token a newline: each step stays one line
    assert "\n" not in newline and newline.count("⏎&lt;") == sum(len(s.drafted) + 2 for s in steps)
    table = dspark_panel.steps_table(trace, slot.engine.tokenizer.token_text)
    assert table["scheduled"].tolist() == [s.verify_len for s in steps]
    assert len(dspark_panel.acceptance_figure(m).data[0].y) == slot.args.dspark_block_size


def test_attention_shares_and_indexer_picks(plain):
    trace = plain.trace
    shares = attention_panel.share_table(trace)
    assert len(shares) == 10
    assert np.allclose(shares[["window", "compressed", "sink"]].sum(axis=1), 1.0, atol=1e-4)
    picks = attention_panel.chosen_positions(trace, 0, 11)
    assert len(picks) >= 1 and all(min(p) >= 0 for p in picks["chosen compressed entries"])
    assert attention_panel.share_table(trace, only="layers.2.attn")["layer"].tolist() == ["layers.2.attn"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_export_round_trips_through_the_uploader(spec, fmt):
    data = trace_bytes(spec.trace, fmt)
    assert trace_from_upload(FORMATS[fmt][0], data) == spec.trace


def test_bad_uploads_get_clear_messages():
    with pytest.raises(TraceFormatError, match="empty"):
        trace_from_upload("t.json", b"")
    with pytest.raises(TraceFormatError, match="t.json.*invalid JSON"):
        trace_from_upload("t.json", b"{nope")
    with pytest.raises(TraceFormatError, match="t.parquet.zip"):
        trace_from_upload("t.parquet.zip", b"not a zip")
    with pytest.raises(ValueError, match="unknown trace format"):
        trace_from_upload("t.txt", b"x")


def test_links_between_diagram_and_panels():
    assert related("layers.3.ffn", "layers.3") and not related("layers.30.ffn", "layers.3")
    assert related("layers.3", "layers.3.hc_ffn") and related("layers.3.ffn", None)
    assert [panel_for(n) for n in ("layers.3.ffn.gate", "layers.3.hc_attn", "layers.1.engram", "layers.2.attn",
                                   "mtp.1", "embed")] == ["Experts", "mHC", "Engram", "Attention", "DSpark", None]
    assert filter_path("layers.3.ffn.experts") == "layers.3.ffn" and filter_path("layers.3.hc_ffn") == "layers.3"
    assert mhc_site("layers.3.hc_ffn") == "ffn" and diagram_node("mHC", "layers.3", "attn") == "layers.3.hc_attn"


def test_model_choices(tmp_path):
    choices = engine_session.model_choices(tmp_path / "none")
    assert {"tiny-v4.1", "default-small", "tiny-v4"} <= set(choices)           # both families run
    assert not {"deepseek-v4.1-flash", "deepseek-v4-flash"} & set(choices)      # too big for random weights
    assert engine_session.default_model(choices) == "tiny-v4.1"
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "config.json").write_text(engine_session.model_choices()["tiny-v4.1"].config.read_text())
    with_ckpt = engine_session.model_choices(tmp_path)
    assert with_ckpt["checkpoint:default"].checkpoint == tmp_path / "default"
    assert engine_session.default_model(with_ckpt) == "checkpoint:default"


def test_settings_are_checked():
    for bad, msg in ((GenSettings("  "), "empty"), (GenSettings("x", max_new_tokens=0), "max new tokens"),
                     (GenSettings("x", top_p=0.0), "top-p"), (GenSettings("x", schedule="fast"), "schedule")):
        with pytest.raises(ValueError, match=msg):
            bad.check()


def test_stop_keeps_what_was_generated(slot):
    settings = GenSettings(PROMPT, max_new_tokens=8)
    run = LiveRun(new_trace(settings, "tiny-v4.1", ""), "tiny-v4.1")

    def stop_after_three(r, _piece):
        if r.n_tokens == 3:
            raise KeyboardInterrupt  # stands in for Streamlit's interruption of the script
    with pytest.raises(KeyboardInterrupt), slot.turn() as engine:
        generate_into(engine, settings, run, stop_after_three)
    assert run.n_tokens == 3 and sum(t.generated for t in run.trace.tokens(0)) == 3
    assert not slot.busy                                  # the lock was released


def test_sessions_take_turns_and_get_their_own_output(slot, plain):
    order, seen_waiting = [], []
    first_in = threading.Event()
    release = threading.Event()

    def holder():
        with slot.turn():
            first_in.set()
            order.append("holder")
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    first_in.wait(5)
    results = {}

    def waiter():
        results["run"] = _run_waiting(slot, seen_waiting)

    w = threading.Thread(target=waiter)
    w.start()
    while not seen_waiting:
        threading.Event().wait(0.05)
    assert slot.waiting() == 1
    release.set()
    t.join(5)
    w.join(60)
    assert seen_waiting[0] == 1                           # the holder's generation is ahead
    assert results["run"].text == plain.text and slot.waiting() == 0


def _run_waiting(slot, seen):
    settings = GenSettings(PROMPT, max_new_tokens=8, attention=True)
    run = LiveRun(new_trace(settings, "tiny-v4.1", slot.engine.source), "tiny-v4.1")
    with slot.turn(on_wait=seen.append, poll_s=0.02) as engine:
        generate_into(engine, settings, run, lambda r, p: None)
    return run


def test_a_checkpoint_directory_becomes_the_default_model(slot, tmp_path):
    import torch

    from engine.checkpoint.store import save_checkpoint
    from engine.generation import Engine
    other = Engine.load("tiny-v4.1", seed=7)                 # weights unlike the seed-0 random default
    save_checkpoint(other.model, tmp_path / "default", args=other.args)   # model.safetensors + config.json
    choices = engine_session.model_choices(tmp_path)
    assert engine_session.default_model(choices) == "checkpoint:default"
    trained = engine_session.load_slot(choices["checkpoint:default"])
    assert trained.choice.checkpoint == tmp_path / "default" and "checkpoint" in trained.engine.source
    mine, theirs, random0 = (e.model.state_dict() for e in (trained.engine, other, slot.engine))
    floats = [k for k, v in theirs.items() if v.is_floating_point() and v.numel()]
    assert all(torch.equal(mine[k], theirs[k]) for k in floats)
    assert not all(torch.equal(mine[k], random0[k]) for k in floats)


def test_prompt_tokens_carry_their_teacher_forced_probability(slot, plain):
    """Every prompt token after BOS has the probability the model gave it (from the prompt's logits), and that
    agrees with the probability the same token gets when the model generates it."""
    prompt = [t for t in plain.trace.tokens(0) if not t.generated]
    assert np.isnan(prompt[0].logprob) and all(np.isfinite(t.logprob) and t.logprob <= 0 for t in prompt[1:])
    first = next(t for t in plain.trace.tokens(0) if t.generated)
    ids = [t.token_id for t in prompt] + [first.token_id]        # the first generated token, now part of the prompt
    forced = Trace()
    slot.engine.generate([ids], max_new_tokens=1, trace=forced)
    again = next(t for t in forced.tokens(0) if t.pos == first.pos)
    assert not again.generated and again.logprob == pytest.approx(first.logprob, abs=1e-4)
    table = token_table(plain.trace, 0, lambda i: slot.engine.tokenizer.token_text(i))
    assert table["p under the model"].iloc[0].startswith("– (first token")
    assert all(float(p) > 0 for p in table["p under the model"].iloc[1:])
    assert table["top-k alternatives: 'text' p (#id)"].iloc[3].count("(#") == 5 and "'" in table.iloc[3, 5]


def test_a_trace_without_probabilities_still_loads():
    """Traces written before prompt probabilities were recorded (no logprob column) load, reading NaN."""
    from engine.trace import Trace
    trace = Trace()
    trace.record_prompt(0, [1, 2], ["a", "b"])
    tables, header = trace.to_tables()
    del tables["tokens"]["logprob"], header["schema"]["tokens"]["logprob"]
    loaded = Trace.from_tables(tables, header)
    assert [np.isnan(t.logprob) for t in loaded.tokens(0)] == [True, True]


def test_visible_text_and_alternatives():
    assert visible(" a\n\tb\u200b") == "·a⏎⇥b\\u200b" and visible("") == "∅"
    from engine.trace import TokenRecord
    t = TokenRecord(0, 3, 7, " x", True, top_ids=np.array([7, 9]), top_probs=np.array([0.6, 0.3], np.float32))
    assert alternatives(t, {7: " x", 9: "\n"}.get) == "✓ '·x' 0.600 (#7) · '⏎' 0.300 (#9)"
    assert alternatives(t, lambda i: None) == "✓ (text unknown) 0.600 (#7) · (text unknown) 0.300 (#9)"


def test_status_sentences():
    run = LiveRun(new_trace(GenSettings("x"), "m", ""), "m", status="done", finish="length", n_tokens=24)
    assert status_sentence(run) == "stopped at max new tokens (24 tokens)"
    run.finish = "stop"
    assert status_sentence(run) == "reached end of text after 24 tokens"
    run.status, run.stopped_by, run.n_tokens = "stopped", "you", 38
    assert status_sentence(run) == "stopped by you after 38 tokens"
    run.status, run.phase, run.profiled = "running", "profiling", (3, 18)
    assert status_sentence(run) == "profiling this machine for the auto schedule (3/18 shapes)"


def test_a_background_run_finishes_and_stops_on_request(slot, plain):
    """The page's generation runs in its own thread: it finishes by itself (same text as in the foreground), and
    Stop ends it within a step, keeping what it made."""
    from v41viz.inspect import background
    settings = GenSettings(PROMPT, max_new_tokens=8, attention=True)
    run = LiveRun(new_trace(settings, "tiny-v4.1", "", slot.args), "tiny-v4.1", prompt=PROMPT)
    background.start(slot, settings, run).join(60)
    assert (run.status, run.text, run.trace.meta["finish"]) == ("done", plain.text, "length")
    assert run.trace.meta["n_routed_experts"] == slot.args.n_routed_experts and run.trace.meta["token_texts"]
    long = GenSettings(PROMPT, max_new_tokens=400)
    run = LiveRun(new_trace(long, "tiny-v4.1", ""), "tiny-v4.1", prompt=PROMPT)
    background.start(slot, long, run)
    while run.n_tokens < 3:
        threading.Event().wait(0.02)
    background.stop(run)
    assert not run.active and run.status == "stopped" and status_sentence(run).startswith("stopped by you after")
    assert 3 <= run.n_tokens < 400 and sum(t.generated for t in run.trace.tokens(0)) == run.n_tokens
    assert run.trace.meta["finish"] == "stopped" and not slot.busy


def test_prompt_problems_are_sentences():
    with pytest.raises(ValueError, match=r"character 3 is a lone UTF-16 surrogate \(U\+D800\)"):
        GenSettings("ab\ud800cd").check()
    assert prompt_problem("fine") == ""


def test_a_trace_with_invalid_text_is_refused_by_name(spec):
    """JSON escapes can carry a lone surrogate into a trace's prompt or token text; Streamlit cannot send such a
    string to the browser, so the upload is refused with the place named."""
    import json
    body = json.loads(trace_bytes(spec.trace, "json"))
    body["header"]["meta"]["prompt"] = "ROMEO\ud800:"
    with pytest.raises(TraceFormatError, match=r"t.json: meta 'prompt' is not valid text: character 6 is a lone "
                                               r"UTF-16 surrogate \(U\+D800\)"):
        trace_from_upload("t.json", json.dumps(body).encode())
    body = json.loads(trace_bytes(spec.trace, "json"))
    body["tables"]["tokens"]["text"][2] = "\udfff"
    with pytest.raises(TraceFormatError, match=r"the text of token 2 \(row 0\) is not valid text"):
        trace_from_upload("t.json", json.dumps(body).encode())


def test_links_parse_strictly_and_round_trip():
    link, notes = parse_link({"token": "²", "panel": "Nope", "layer": "zzz", "seam": "up", "temperature": "1e9",
                              "seed": "-1", "max_new": "9999", "dspark": "maybe", "node": "layers.1.engram<x>",
                              "top_p": "0.001", "schedule": "fast", "pid": "xyz"})
    assert link == InspectLink() and len(notes) == 12
    assert all("was ignored" in n for n in notes) and any("`token=²`" in n for n in notes)
    for token in ("-1", "1e9", "٣", " 3", "3.0", "99999999999"):
        assert parse_link({"token": token})[0].token is None, token
    settings = {"prompt": "Now is\nthe winter ", "max_new_tokens": 12, "temperature": 0.7, "top_p": 0.95, "top_k": 40,
                "seed": 5, "dspark": True, "schedule": "threshold", "threshold": 0.35, "attention": False,
                "repetition_penalty": 1.25, "no_repeat_ngram": 5}
    view = {"panel": "mHC", "node": "layers.3.hc_ffn", "layer": "layers.3", "seam": "ffn", "token": 6}
    query = link_params("checkpoint:default", settings, view)
    back, notes = parse_link(query)
    assert notes == [] and back.model == "checkpoint:default" and back.prompt == settings["prompt"]
    assert back.settings == {k: v for k, v in settings.items() if k != "prompt"}
    assert (back.panel, back.node, back.layer, back.seam, back.token) == ("mHC", "layers.3.hc_ffn", "layers.3", "ffn", 6)
    long = link_params("m", {"prompt": "x" * 2000}, {})
    assert "prompt" not in long and long["pid"] == prompt_id("x" * 2000) and parse_link(long)[0].prompt_id


def test_links_carry_a_runs_what_if_changes():
    """A what-if run's link names its changes (canonical text, comma-separated) and reads them back; a bad change,
    or too many, is a note naming the key, and the link keeps its other parts."""
    changes = ("ban-expert:3:5@12-", "engram-off:4", "mhc-identity:2@3-7")
    query = link_params("checkpoint:default", {"prompt": "ROMEO:", "interventions": changes}, {})
    assert query["intervene"] == "ban-expert:3:5@12-,engram-off:4,mhc-identity:2@3-7"
    back, notes = parse_link(query)
    assert notes == [] and back.interventions == changes and back.prompt == "ROMEO:"
    assert "intervene" not in link_params("m", {"prompt": "x", "interventions": ()}, {})
    for bad in ("ban-expert:3", "engram-off:4,nope:1", "ban-expert:3:5@9-2", ",".join(["engram-off:1"] * 17)):
        link, notes = parse_link({"prompt": "Hi", "intervene": bad})
        assert link.interventions == () and link.prompt == "Hi" and len(notes) == 1, (bad, notes)
        assert notes[0].startswith(f"`intervene={bad[:39]}") and "was ignored" in notes[0]


def test_the_nearest_layer_of_the_same_kind():
    from engine.spec.config import load_config
    from engine.spec.presets import list_presets
    flash = load_config(list_presets()["deepseek-v4.1-flash"])
    small = engine_session.model_choices()["tiny-v4.1"]
    run = load_config(small.config)
    assert missing_reason("layers.14.engram", run, "tiny") == "the model to run (tiny, 10 layers) has no layer 14"
    assert missing_reason("layers.3.engram", run, "tiny") == "layer 3 of the model to run (tiny) has no Engram module"
    assert missing_reason("layers.4.engram", run, "tiny") is None and missing_reason("embed", run, "tiny") is None
    assert nearest_equivalent("layers.14.engram", run, flash) == "layers.4.engram"   # the 2nd of 2 Engram layers
    assert nearest_equivalent("layers.1.engram", run, flash) == "layers.1.engram"
    assert nearest_equivalent("layers.3.engram", run) == "layers.4.engram"           # by layer number, no diagram
    assert nearest_equivalent("layers.39.attn.indexer", run, flash) == "layers.9.attn.indexer"
    assert nearest_equivalent("mtp.5", run) == f"mtp.{run.n_draft_stages - 1}"


def test_panels_draw_another_models_trace_from_the_trace_alone(spec):
    """A trace replayed without its model: sizes come from the trace (meta, else the records), token texts from
    the trace (else #id), and every builder draws."""
    trace = Trace.from_tables(*spec.trace.to_tables())
    trace.meta = {"config": "someone-else"}
    facts = trace_model(trace)
    assert facts.n_routed_experts >= int(max(v[0].max() for *_, v in trace.facts("moe"))) + 1
    assert facts.n_activated_experts == 2 and facts.engram_max_ngram_size == 0
    heat = experts_panel.choice_heatmap(trace)
    assert heat.data[0].zmax == facts.n_routed_experts - 0.5
    load = experts_panel.load_figure(trace)
    assert load.data[0].zmin == 0 and load.data[0].zmax >= 2
    path = engram_panel.engram_paths(trace)[0]
    pos = next(p for _, _, _, p, _ in trace.facts("engram"))
    assert list(engram_panel.rows_table(trace, facts, path, 0, pos).index) == ["rows"]
    lookup = text_lookup(trace)
    step = trace.dspark_steps[0]
    assert lookup(step.anchor_token) is not None and lookup(10**8) is None
    html_page = dspark_panel.steps_html(trace, shown_text(lookup))
    assert html_page.count("<div><b>step") == len(trace.dspark_steps)
    assert experts_panel.touched_figure(trace).data[0].name.startswith(f"closed form: E={facts.n_routed_experts}")


def test_charts_keep_ratios_non_negative_and_ids_categorical(plain):
    load = experts_panel.load_figure(plain.trace, 8).data[0]
    assert load.zmin == 0 and load.colorscale[0][0] == 0 and load.colorscale[-1][0] == 1
    white = [x for x, c in load.colorscale if c == "#f7f7f7"][0]
    assert white == pytest.approx(1.0 / load.zmax)                   # white sits at ratio 1 (balanced)
    scale = experts_panel.choice_heatmap(plain.trace, n_experts=8).data[0].colorscale
    colours = [c for _, c in scale]
    assert colours[0::2] == colours[1::2] and len(set(colours)) == 8
    fig = mhc_panel.residual_figure(plain.trace)
    assert fig.layout.xaxis.tickangle == -90 and len(fig.layout.xaxis.tickvals) <= 10


def test_prompt_probabilities_do_not_depend_on_the_chunking(slot, monkeypatch):
    """A long prompt is scored in chunks that bound the logits held at once; the chunks give the same
    probabilities as one pass (chunked prefill equals one-shot prefill)."""
    from engine.generation import results
    ids = slot.engine.encode("It was the best of times, it was the worst of times, it was the age of wisdom")

    def probabilities(values: int) -> list[float]:
        monkeypatch.setattr(results, "PROMPT_LOGITS_VALUES", values)
        trace = Trace()
        slot.engine.generate([ids], max_new_tokens=1, trace=trace)
        return [t.logprob for t in trace.tokens(0) if not t.generated][1:]
    whole, chunked = probabilities(2**30), probabilities(3 * slot.args.vocab_size)   # 3 positions per chunk
    assert len(whole) == len(ids) - 1 and np.allclose(whole, chunked, atol=1e-4)


def test_a_v4_run_labels_its_hash_routed_layers_and_routes_by_token_id():
    """V4 presets run in the app; the experts heatmap marks the first n_hash_layers MoE layers as hash-routed, and
    there each token's experts are its row of the tid2eid table."""
    v4 = engine_session.load_slot(engine_session.model_choices()["tiny-v4"])
    settings = GenSettings(PROMPT, max_new_tokens=4)
    run = LiveRun(new_trace(settings, "tiny-v4", v4.engine.source, v4.args), "tiny-v4", prompt=PROMPT)
    with v4.turn() as engine:
        generate_into(engine, settings, run, lambda r, p: None)
    hashed = v4.args.n_hash_layers
    assert hashed > 0
    paths = experts_panel.moe_paths(run.trace)
    labels = list(experts_panel.choice_heatmap(run.trace).data[0].y)
    assert labels[:hashed] == [f"{p} (hash-routed)" for p in paths[:hashed]]
    assert not any("hash" in label for label in labels[hashed:])
    table = v4.engine.model.layers[0].ffn.gate.tid2eid
    prompt_ids = v4.engine.encode(PROMPT, True)
    positions, ids, _, _ = experts_panel.choice_grid(run.trace, 0, paths[:1])
    for j, pos in enumerate(positions[:len(prompt_ids)]):
        assert sorted(ids[0, j].tolist()) == sorted(table[prompt_ids[pos]].tolist())


def test_logit_lens_views_agree_with_the_trace(plain, slot):
    """Layers down at one token: each layer's top token and probability, the rank and probability of the token that
    came next; the last layer's read-out is the model's own distribution (the next token's top-k, greedy rank 1)."""
    trace = plain.trace
    paths = lens_panel.lens_paths(trace)
    assert paths == [f"layers.{i}" for i in range(slot.args.n_layers)]
    assert lens_panel.lens_paths(trace, "layers.3.ffn") == ["layers.3"]
    text = shown_text(text_lookup(trace, slot.engine.tokenizer.token_text))
    toks = trace.tokens(0)
    pos = len(toks) - 3                                   # a generated token whose successor was generated too
    nxt = toks[pos + 1]
    table = lens_panel.lens_table(trace, 0, pos, text)
    chosen = f"'{visible(text(nxt.token_id))}'"
    assert list(table.columns) == ["layer", "top token", "p", "runners-up", f"rank of {chosen}", f"p of {chosen}"]
    assert list(table["layer"]) == paths
    for line, path in zip(table.itertuples(index=False), paths):
        rec = trace.fact("lens", path, 0, pos)
        assert line[1] == f"'{visible(text(rec['top_ids'][0]))}'" and line[2] == probability_text(rec["top_probs"][0])
        assert line[3].count(" · ") == 3 and line[4] == rec["next_rank"] and rec["next_id"] == nxt.token_id
    last = trace.fact("lens", paths[-1], 0, pos)
    assert last["top_ids"].tolist() == nxt.top_ids.tolist() and last["next_rank"] == 1
    np.testing.assert_allclose(last["top_probs"], nxt.top_probs, rtol=1e-5)
    fig = lens_panel.lens_figure(trace, 0, pos, text)
    bars, diamonds = fig.data
    assert list(bars.y) == paths and np.allclose(bars.x, [trace.fact("lens", p, 0, pos)["top_probs"][0] for p in paths])
    assert list(diamonds.customdata) == [int(trace.fact("lens", p, 0, pos)["next_rank"]) for p in paths]
    norms = lens_panel.norm_figure(trace, 0, pos)
    assert len(norms.data) == 1 + slot.args.hc_mult
    assert np.allclose(norms.data[2].y, [trace.fact("lens", p, 0, pos)["rms_out"][1] for p in paths])
    heat = lens_panel.next_token_heatmap(trace).data[0]
    assert np.asarray(heat.z).shape == (len(paths), len(toks) - 1)
    bars = lens_panel.logprob_figure(trace, 0, pos).data
    assert [b.name for b in bars] == ["prompt (teacher-forced)", "generated"]
    assert np.allclose(bars[1].y, [t.logprob for t in toks if t.generated])
    copy = Trace.from_tables(*trace.to_tables())
    record_texts(copy, slot.engine.tokenizer.token_text)         # a saved trace names each layer's top tokens
    assert {str(i) for *_, v in copy.facts("lens") for i in v[0].tolist()} <= \
        set(copy.meta[TEXTS]) | {str(t.token_id) for t in toks}
    empty = Trace()
    assert lens_panel.lens_table(empty, 0, 0, text).empty and not lens_panel.lens_paths(empty)
