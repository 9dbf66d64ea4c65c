"""AppTest of the Inspect page's "What if…" section (issue 20 item 4): defaults from the selected token and layer, a
rerun with a banned expert checked against both traces, the engine's sentence for a bad choice, several changes at
once, and the rerun opened as the main run."""
from __future__ import annotations

from engine.request.interventions import parse_intervention
from tests.app.test_app_inspect import generate, inspect_page
from v41viz.inspect.what_if import position_that_matters
from v41viz.ui.page_links import LIVE_RUN
from v41viz.ui.what_if import STATE

LAYER, POS = 3, 4      # a learned-routed layer of the shipped model and a prompt token ("ROMEO:" is BOS RO M E O :)


def experts(trace, layer: int, pos: int) -> set[int]:
    return {int(e) for e in trace.fact("moe", f"layers.{layer}.ffn", 0, pos)["ids"]}


def markdown(at) -> str:
    """The page's markdown with the escapes of literal text (tables, names) taken out."""
    return "\n".join(m.value for m in at.markdown).replace("\\", "")


def test_ban_the_chosen_expert_from_the_selected_token_on():
    at = generate(inspect_page(node=f"layers.{LAYER}.ffn", token=str(POS)), prompt="ROMEO:", max_new=10)
    assert not at.exception, at.exception
    baseline = at.session_state[LIVE_RUN]
    chosen = experts(baseline.trace, LAYER, POS)
    top = max(zip(*(baseline.trace.fact("moe", f"layers.{LAYER}.ffn", 0, POS)[k] for k in ("ids", "weights"))),
              key=lambda p: p[1])[0]
    # the defaults follow what is looked at: the Experts panel, layer 3, the expert the token leaned on most
    assert at.selectbox(key="what_if_kind").value == "ban-expert"
    assert at.selectbox(key="what_if_layer").value == LAYER
    assert at.selectbox(key="what_if_expert").value == int(top)
    assert at.radio(key="what_if_scope").value == "onwards"
    text = f"ban-expert:{LAYER}:{int(top)}@{POS}-"
    sentence = f"ban expert {int(top)} at layer {LAYER}, from token {POS} on"
    assert sentence in markdown(at) and text in markdown(at)
    at.button(key="what_if_rerun").click()
    at.run()
    assert not at.exception, at.exception
    held = at.session_state[STATE]
    assert held.baseline is baseline and held.run.status == "done", held.run.message
    rerun = held.run.trace
    assert rerun.meta["interventions"] == [text] and baseline.trace.meta["interventions"] == []
    assert rerun.meta["seed"] == baseline.trace.meta["seed"] and rerun.meta["prompt"] == "ROMEO:"
    # the traces themselves: nothing moved before the token; from it on the banned expert is gone at that layer
    same = [t.pos for t, u in zip(baseline.trace.tokens(), rerun.tokens()) if t.token_id == u.token_id]
    for layer in range(8):
        for pos in range(POS):
            assert experts(rerun, layer, pos) == experts(baseline.trace, layer, pos), (layer, pos)
    for pos in range(POS, max(same)):
        assert int(top) not in experts(rerun, LAYER, pos), pos
    assert experts(rerun, LAYER, POS) != chosen
    # what the page says about it
    shown = markdown(at)
    assert f"**The change:** {sentence}" in shown and "rerun status: **stopped at max new tokens (10 tokens)**" in shown
    assert any(f"changed: {sentence}" in c.value for c in at.caption)
    dropped = sorted(chosen - experts(rerun, LAYER, POS))
    token = next(t.text for t in baseline.trace.tokens() if t.pos == POS)
    assert f"| layers.{LAYER}.ffn | {POS} | {token} | {sorted(chosen)} | {sorted(experts(rerun, LAYER, POS))} | " \
           f"{dropped} |" in shown, shown
    assert f"No expert choice changed before position {POS} (the first position the change applies at)" in shown
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["first divergence"] in ("none", *(f"position {p}" for p in range(POS + 1, 30)))
    assert len(at.get("plotly_chart")) >= 2 and at.button(key="what_if_open")


def test_a_bad_choice_shows_the_engine_sentence_and_nothing_runs():
    at = generate(inspect_page(panel="Engram"), prompt="ROMEO:", max_new=4)
    assert at.selectbox(key="what_if_kind").value == "engram-off"
    assert at.selectbox(key="what_if_layer").value in (1, 4)          # the shipped model's Engram layers
    at.selectbox(key="what_if_layer").set_value(3)
    at.run()
    assert not at.exception, at.exception
    assert any("intervention 'engram-off:3@" in e.value and "layer 3 has no Engram (Engram layers: 1, 4)" in e.value
               for e in at.error), [e.value for e in at.error]
    assert at.button(key="what_if_rerun").disabled and STATE not in at.session_state


def test_two_changes_at_once_and_the_rerun_becomes_the_main_run():
    at = generate(inspect_page(panel="DSpark"), prompt="ROMEO:", max_new=8, dspark=True)
    assert at.selectbox(key="what_if_kind").value == "drop-stage"
    at.radio(key="what_if_scope").set_value("all")
    at.run()
    at.button(key="what_if_keep").click()
    at.run()
    assert any("Also applied: drop DSpark stage 0, every token" in c.value for c in at.caption)
    at.selectbox(key="what_if_kind").set_value("engram-off")
    at.run()
    at.selectbox(key="what_if_layer").set_value(4)
    at.radio(key="what_if_scope").set_value("token")
    at.run()
    assert at.button(key="what_if_rerun").label == "Rerun with these 2 changes"
    at.button(key="what_if_rerun").click()
    at.run()
    assert not at.exception, at.exception
    held = at.session_state[STATE]
    # the selected token is the last the model read: the change starts where it can matter (position_that_matters)
    pos, _ = position_that_matters(held.baseline.trace, at.select_slider(key="inspect_token").value)
    assert held.run.trace.meta["interventions"] == ["drop-stage:0", f"engram-off:4@{pos}"]
    assert [parse_intervention(t).text for t in held.changes] == held.run.trace.meta["interventions"]
    assert held.run.trace.dspark_steps and held.run.status == "done"
    at.button(key="what_if_open").click()
    at.run()
    assert not at.exception, at.exception
    assert at.session_state[LIVE_RUN] is held.run and STATE not in at.session_state
    line = next(c.value for c in at.caption if c.value.startswith("Made with"))
    assert f"changed: drop DSpark stage 0, every token; switch off Engram at layer 4, token {pos} only" in line
