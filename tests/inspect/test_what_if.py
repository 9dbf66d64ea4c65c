"""What-if reruns without the page (v41viz.inspect.what_if): the text of a picked change, the rerun's settings, and
the log-probability and routing differences read off two real runs of the shipped model."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.spec.config import load_config
from tests.run_helpers import traced_run
from v41viz.inspect import what_if
from v41viz.inspect.run import GenSettings, LiveRun, new_trace
from v41viz.inspect.run_diff import diff_traces
from v41viz.ui import engine_session

PROMPT, NEW, LAYER, POS = "ROMEO:", 16, 5, 4


@pytest.fixture(scope="module")
def slot():
    return engine_session.load_slot(engine_session.model_choices()["checkpoint:default"])


@pytest.fixture(scope="module")
def runs(slot):
    """The baseline and a rerun that bans, from POS on, the expert the token at POS leaned on most at LAYER."""
    base = traced_run(slot, PROMPT, NEW, attention=False)
    banned = what_if.chosen_experts(base, LAYER, POS)[0][0]
    change = what_if.intervention_text("ban-expert", LAYER, banned, POS, "onwards")
    return base, traced_run(slot, PROMPT, NEW, attention=False, interventions=(change,)), banned


def test_a_picked_change_becomes_the_engine_text_and_the_rerun_keeps_the_settings():
    args = load_config(engine_session.CHECKPOINTS / "default" / "config.json")
    assert [what_if.intervention_text("ban-expert", 3, 5, 12, s) for s in what_if.SCOPES] == \
        ["ban-expert:3:5@12", "ban-expert:3:5@12-", "ban-expert:3:5"]
    assert what_if.intervention_text("no-candidate-filter", None, None, 7, "onwards") == "no-candidate-filter@7-"
    assert what_if.looked_layer({"node": "layers.6.attn"}) == (6, None)
    assert what_if.looked_layer({"node": "", "layer": "mtp.2"}) == (None, 2)
    assert what_if.default_layer(args, "engram-off", 3) == 1 and what_if.default_layer(args, "engram-off", 4) == 4
    assert what_if.default_expert("ban-expert", [(7, 0.8), (2, 0.6)], 16) == 7
    assert what_if.default_expert("force-expert", [(0, 0.8), (2, 0.6)], 16) == 1
    assert what_if.offered_kinds(False)[-1] != "drop-stage" and "drop-stage" in what_if.offered_kinds(True)
    settings = GenSettings(PROMPT, max_new_tokens=9, temperature=0.7, top_k=20, seed=11,
                           interventions=("engram-off:1",))
    baseline = LiveRun(new_trace(settings, "checkpoint:default", "w"), "checkpoint:default", prompt=PROMPT)
    rerun = what_if.rerun_settings(baseline, ("ban-expert:3:5@2-", "engram-off:1"))
    assert rerun == GenSettings(PROMPT, max_new_tokens=9, temperature=0.7, top_k=20, seed=11,
                                interventions=("engram-off:1", "ban-expert:3:5@2-"))
    assert what_if.first_position(rerun.interventions) == 0 and what_if.first_position(("ban-expert:3:5@2-",)) == 2


def test_logprob_changes_follow_the_traces_until_the_divergence(runs):
    base, rerun, _ = runs
    diff = diff_traces(base, rerun)
    shared = diff.tokens.shared_prefix
    lp = what_if.logprob_changes(base, rerun, shared)
    theirs = {t.pos: t for t in rerun.tokens()}
    assert lp["pos"].tolist() == [t.pos for t in base.tokens()]
    for t, line in zip(base.tokens(), lp.to_dict("records")):
        if t.pos == 0:
            assert math.isnan(line["change"])
        elif t.pos <= POS:    # predicted from tokens before the change: the same numbers
            assert abs(line["change"]) < 1e-4, line
        elif t.pos < shared:
            assert line["change"] == pytest.approx(theirs[t.pos].logprob - t.logprob, abs=1e-6)
        elif t.pos == shared:
            other = theirs[t.pos]
            hit = other.top_ids == t.token_id
            if hit.any():
                assert line["change"] == pytest.approx(math.log(other.top_probs[hit][0]) - t.logprob, abs=1e-5)
            else:   # below the rerun's top-k: a bound, and the baseline's token lost more than that
                assert math.isnan(line["change"])
                assert line["change at most"] == pytest.approx(math.log(other.top_probs.min()) - t.logprob, abs=1e-5)
        else:
            assert math.isnan(line["change"]) and "after the divergence" in line["compared"]
    assert np.isfinite(lp["change"]).sum() >= min(shared, len(lp)) - 1


def test_routing_changes_are_the_layers_and_tokens_whose_experts_differ(runs):
    base, rerun, banned = runs
    diff = diff_traces(base, rerun)
    shared = diff.tokens.shared_prefix
    changes = what_if.routing_changes(diff, base)

    def experts(trace, layer, pos):
        rec = trace.fact("moe", f"layers.{layer}.ffn", 0, pos)
        return None if rec is None else sorted(int(e) for e in rec["ids"])
    expected = {(f"layers.{layer}.ffn", pos) for layer in range(8) for pos in range(shared)
                if experts(base, layer, pos) is not None and experts(base, layer, pos) != experts(rerun, layer, pos)}
    assert set(zip(changes["layer"], changes["pos"])) == expected
    assert (f"layers.{LAYER}.ffn", POS) in expected and min(pos for _, pos in expected) == POS
    for line in changes.to_dict("records"):
        assert banned not in line["rerun experts"] or line["layer"] != f"layers.{LAYER}.ffn"
        assert line["dropped"] == sorted(set(line["baseline experts"]) - set(line["rerun experts"]))
    by_layer = what_if.routing_by_layer(diff, changes).set_index("layer")
    assert by_layer.loc[f"layers.{LAYER}.ffn", "first at position"] == str(POS)
    assert by_layer["chose other experts"].sum() == len(changes)
