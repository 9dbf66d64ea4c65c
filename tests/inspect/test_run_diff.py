"""Diff of two runs (v41viz.inspect.run_diff) on real traces: tiny-v4 against tiny-v4.1 (run as the Compare page
runs them: A then B through the engine slots), a run against itself, and runs whose prompts or lengths differ."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.dspark.metrics import summarize
from engine.trace import mhc_gain
from tests.run_helpers import traced_run
from v41viz.inspect.export import trace_bytes, trace_from_upload
from v41viz.inspect.run import GenSettings
from v41viz.inspect.run_diff import HASH_ROUTER, LEARNED_ROUTER, chance_jaccard, diff_traces
from v41viz.inspect.run_pair import start_pair
from v41viz.ui import engine_session
from v41viz.ui.run_diff_view import DIFFERS, FIRST, output_html

PROMPT, OTHER_PROMPT = "The quick brown fox", "The quick red fox"   # they differ at the fourth token (after BOS)
NEW = 6


@pytest.fixture(scope="module")
def slots():
    choices = engine_session.model_choices()
    return {key: engine_session.load_slot(choices[key]) for key in ("tiny-v4", "tiny-v4.1")}


@pytest.fixture(scope="module")
def pair(slots):
    """tiny-v4 (A) then tiny-v4.1 (B) with DSpark, through the Compare page's pair runner."""
    settings = GenSettings(PROMPT, max_new_tokens=NEW, dspark=True, attention=False)
    pair = start_pair(slots["tiny-v4"], settings, slots["tiny-v4.1"], settings)
    pair.thread.join(120)
    assert not pair.active and [r.status for r in pair.runs] == ["done", "done"], [r.message for r in pair.runs]
    return pair


def _run(slot, prompt: str = PROMPT, max_new: int = NEW, **kw):
    return traced_run(slot, prompt, max_new, attention=False, **kw)


@pytest.fixture(scope="module")
def v41(slots):
    return _run(slots["tiny-v4.1"])


def _jaccard(x, y) -> float:
    x, y = set(x.tolist()), set(y.tolist())
    return len(x & y) / len(x | y)


def test_v4_against_v41_tokens_routing_layers_and_dspark(pair, slots):
    a, b = pair.a.trace, pair.b.trace
    diff = diff_traces(a, b)
    n_prompt = len(slots["tiny-v4"].engine.encode_prompt(PROMPT))
    assert n_prompt == 5 and diff.a.n_prompt_tokens == diff.b.n_prompt_tokens == n_prompt
    assert (diff.a.model, diff.b.model) == ("tiny-v4", "tiny-v4.1") and diff.a.random_weights and diff.b.random_weights
    t = diff.tokens
    gen_a = [x.text for x in a.tokens(0) if x.generated]
    gen_b = [x.text for x in b.tokens(0) if x.generated]
    assert len(gen_a) == len(gen_b) == t.generated_compared == NEW
    assert t.prompt_same and t.generated_agree == sum(x == y for x, y in zip(gen_a, gen_b))
    first = next((i for i, (x, y) in enumerate(zip(gen_a, gen_b)) if x != y), None)
    assert t.first_generated_divergence == first and t.first_divergence == n_prompt + first
    assert t.shared_prefix == n_prompt + first
    assert list(t.table["part"]).count("prompt") == n_prompt and len(t.table) == n_prompt + NEW
    # routing: both have 8 experts (top-2); the 7 backbone layers of tiny-v4 are shared, draft stages are left out
    assert diff.routing_comparable and "different weights" in diff.routing_note
    r = diff.routing
    assert sorted(set(r["layer"]), key=lambda p: int(p.split(".")[1])) == [f"layers.{i}.ffn" for i in range(7)]
    assert len(r) == 7 * (n_prompt + NEW - 1)                # the last new token is never fed back
    assert r["same input"].sum() == 7 * t.shared_prefix
    for line in r.sample(6, random_state=0).to_dict("records"):
        ids_a = a.fact("moe", line["layer"], 0, line["pos"])["ids"]
        ids_b = b.fact("moe", line["layer"], 0, line["pos"])["ids"]
        assert line["jaccard"] == pytest.approx(_jaccard(ids_a, ids_b)) and line["A experts"] == sorted(ids_a.tolist())
    same = [_jaccard(a.fact("moe", f"layers.{n}.ffn", 0, p)["ids"], b.fact("moe", f"layers.{n}.ffn", 0, p)["ids"])
            for n in range(7) for p in range(t.shared_prefix)]
    assert diff.routing_agreement == pytest.approx(np.mean(same)) and diff.routing_agreement > 0
    assert diff.chance_agreement == pytest.approx(5 / 28)    # E[J] of two random 2-of-8 choices
    # per layer: tiny-v4 routes its first 2 MoE layers by token id; tiny-v4.1 has Engram at layers 1 and 4
    layers = diff.layers.set_index("layer")
    assert list(layers.index) == [f"layers.{i}" for i in range(10)]
    assert list(layers["A router"]) == [HASH_ROUTER] * 2 + [LEARNED_ROUTER] * 5 + ["not in this run"] * 3
    assert list(layers["B router"]) == [LEARNED_ROUTER] * 10
    assert layers["A Engram gate"].isna().all()
    gates = layers["B Engram gate"]
    present = gates.dropna()
    assert list(present.index) == ["layers.1", "layers.4"] and ((present > 0) & (present < 1)).all()
    b1 = [float(np.mean(v[2])) for p, _, _, _, v in b.facts("engram") if p == "layers.1.engram"]
    assert gates["layers.1"] == pytest.approx(np.mean(b1))
    for side, n in (("A", 7), ("B", 10)):
        entropy = layers[f"{side} load entropy (bits)"].dropna()
        assert len(entropy) == n and ((entropy > 0) & (entropy <= 3 + 1e-9)).all()   # at most log2(8)
        assert np.allclose(layers[f"{side} mHC gain"].dropna(), 1.0, atol=1e-3) and \
            layers[f"{side} mHC gain"].notna().sum() == n     # products of doubly stochastic matrices
    positions = sorted({pos for p, _, _, pos, _ in b.facts("mhc") if p.startswith("layers.")})
    after_layer3 = [mhc_gain(next(m for p, s, m in b.mhc_products(0, pos) if (p, s) == ("layers.3", "ffn")))
                    for pos in positions]   # the product after the layer's last seam, averaged over tokens
    assert layers.loc["layers.3", "B mHC gain"] == pytest.approx(np.mean(after_layer3), rel=0, abs=1e-12)
    layer0 = r[(r["layer"] == "layers.0.ffn") & r["same input"]]
    assert layers.loc["layers.0", "agreement (same input)"] == pytest.approx(layer0["jaccard"].mean())
    assert math.isnan(layers.loc["layers.8", "agreement (all tokens)"])
    # DSpark: both drafted; the per-position acceptance is each run's own
    assert diff.dspark_note == "" and list(diff.dspark.columns) == ["draft position", "A acceptance", "B acceptance"]
    for side, trace in (("A", a), ("B", b)):
        m = summarize(trace.dspark_steps)
        facts = diff.a if side == "A" else diff.b
        assert facts.dspark.mean_accepted_length == pytest.approx(m.mean_accepted_length)
        assert m.mean_accepted_length >= 1
        assert np.allclose(diff.dspark[f"{side} acceptance"], m.conditional_acceptance, equal_nan=True)


def test_a_hash_routed_layer_picks_the_same_experts_for_the_same_token_id(pair):
    """What makes V4's first layers "hash-routed": the experts depend on the token id alone."""
    a = pair.a.trace
    by_id: dict[int, set] = {}
    tokens = {t.pos: t.token_id for t in a.tokens(0)}
    for path, _, _, pos, v in a.facts("moe"):
        if path in ("layers.0.ffn", "layers.1.ffn"):
            by_id.setdefault((path, tokens[pos]), set()).add(tuple(sorted(v[0].tolist())))
    assert by_id and all(len(choices) == 1 for choices in by_id.values())


def test_a_run_against_itself_and_an_identical_rerun_agree_fully(slots, v41):
    for other in (v41, _run(slots["tiny-v4.1"])):
        diff = diff_traces(v41, other)
        t = diff.tokens
        assert t.first_divergence is None and t.first_generated_divergence is None and t.prompt_same
        assert t.generated_agree == t.generated_compared == NEW and t.table["same"].all()
        assert diff.routing_agreement == diff.routing_agreement_all == 1.0
        assert (diff.routing["overlap"] == 2).all() and diff.routing["same input"].all()
        assert (diff.layers["agreement (same input)"] == 1.0).all()
        assert diff.routing_note.startswith("the same model and weights")
        assert diff.dspark.empty and diff.dspark_note == "Neither run used DSpark."


def test_different_prompts_diverge_at_the_first_different_token(slots, v41):
    other = _run(slots["tiny-v4.1"], OTHER_PROMPT)
    diff = diff_traces(v41, other)
    t = diff.tokens
    texts = [x.text for x in other.tokens(0) if not x.generated]
    assert texts[3] == " red" and [x.text for x in v41.tokens(0)][3] == " brown"
    assert not t.prompt_same and t.first_divergence == t.shared_prefix == 3
    assert list(t.table.loc[t.table["part"] == "prompt", "same"]) == [True, True, True, False, True]
    r = diff.routing
    assert set(r.loc[r["same input"], "pos"]) == {0, 1, 2}
    assert (r.loc[r["same input"], "jaccard"] == 1.0).all()   # one model, one input: one routing
    assert diff.routing_agreement == 1.0 and diff.routing_agreement_all < 1.0


def test_a_shorter_run_diverges_where_it_ends(slots, v41):
    short = _run(slots["tiny-v4.1"], max_new=4)
    t = diff_traces(short, v41).tokens
    assert (t.generated_compared, t.generated_agree, t.first_generated_divergence) == (4, 4, 4)
    assert t.first_divergence == 5 + 4 and list(t.table["B pos"].iloc[-2:]) == [9, 10]
    assert list(t.table["A pos"].iloc[-2:]) == [-1, -1] and not t.table["same"].iloc[-1]


def test_only_one_run_with_dspark_and_unequal_expert_counts(pair, v41):
    diff = diff_traces(v41, pair.b.trace)
    assert diff.dspark_note.startswith("Only B used DSpark") and list(diff.dspark.columns) == ["draft position",
                                                                                              "B acceptance"]
    bigger = trace_from_upload("b.json", trace_bytes(pair.b.trace, "json"))
    bigger.meta["n_routed_experts"] = 16
    diff = diff_traces(v41, bigger)
    assert not diff.routing_comparable and diff.routing_note.startswith("not comparable: A has 8 routed experts")
    assert diff.routing.empty and math.isnan(diff.routing_agreement) and math.isnan(diff.chance_agreement)
    assert diff.layers["agreement (all tokens)"].isna().all()


def test_saved_traces_diff_like_the_live_ones(pair):
    loaded = [trace_from_upload(f"{s}.json", trace_bytes(r.trace, "json")) for s, r in zip("ab", pair.runs)]
    live, again = diff_traces(pair.a.trace, pair.b.trace), diff_traces(*loaded)
    assert live.tokens.table.equals(again.tokens.table) and live.routing.equals(again.routing)
    assert live.layers.equals(again.layers) and live.dspark.equals(again.dspark)


def test_chance_jaccard():
    assert chance_jaccard(8, 2, 2) == pytest.approx(5 / 28)
    assert chance_jaccard(4, 4, 4) == 1.0 and chance_jaccard(6, 1, 1) == pytest.approx(1 / 6)
    assert math.isnan(chance_jaccard(0, 2, 2)) and math.isnan(chance_jaccard(4, 5, 2))


def test_outputs_mark_the_differing_tokens(pair):
    diff = diff_traces(pair.a.trace, pair.b.trace)
    t = diff.tokens
    page = output_html(t, "A")
    differing = int((~t.table["same"]).sum())
    assert page.count(f"background:{DIFFERS}") == differing > 0
    assert page.count(f"outline:2px solid {FIRST}") == 1
    assert page.count("<b ") == diff.a.n_prompt_tokens               # prompt tokens in bold
    same = output_html(diff_traces(pair.a.trace, pair.a.trace).tokens, "B")
    assert DIFFERS not in same and FIRST not in same and "B has" not in same and "A has the same token" in same


def test_stop_before_b_starts_leaves_b_unrun(slots):
    settings = GenSettings(PROMPT, max_new_tokens=400, attention=False)
    pair = start_pair(slots["tiny-v4.1"], settings, slots["tiny-v4"], settings)
    for _ in range(400):
        if pair.a.n_tokens >= 2:
            break
        pair.a.stop_requested.wait(0.02)
    pair.stop()
    assert not pair.active
    assert pair.a.status == "stopped" and 2 <= pair.a.n_tokens < 400
    assert pair.b.status == "stopped" and pair.b.n_tokens == 0 and pair.b.thread is None
    assert pair.b.trace.meta["finish"] == "stopped"


def test_a_cli_trace_of_v4_names_its_hash_routed_layers(pair, tmp_path, capsys):
    """`python -m engine generate --trace` records the model's sizes, so a saved V4 run compares like a live one."""
    from engine.cli import main
    from engine.trace import Trace
    out = tmp_path / "v4.json"
    assert main(["generate", "--config", "tiny-v4", "--random-init", "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--trace", str(out)]) == 0
    capsys.readouterr()
    diff = diff_traces(Trace.load(out), pair.a.trace)
    assert list(diff.layers["A router"]) == list(diff.layers["B router"]) == [HASH_ROUTER] * 2 + [LEARNED_ROUTER] * 5
    assert diff.routing_note.startswith("the same model and weights") and diff.tokens.prompt_same
    assert diff.routing_agreement == 1.0 and diff.tokens.generated_agree == 3   # greedy: the same first 3 tokens
