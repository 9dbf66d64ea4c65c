"""What a user set survives a visit to another page (issue 45 part 2): the Inspect form's edits not yet generated,
the selected panel and token, and the URL names the model picked."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP, TIMEOUT, architecture_page, inspect_page


def query(at, key: str) -> str | None:
    v = at.query_params.get(key)
    return v[-1] if isinstance(v, list) else v


@pytest.mark.slow  # loads tiny-v4.1 [~8 s]
def test_form_edits_not_yet_generated_survive_another_page():
    at = inspect_page(model="tiny-v4.1")
    at.text_area(key="inspect_prompt").input("Not generated yet")
    at.number_input(key="inspect_max_new").set_value(9)
    at.number_input(key="inspect_temperature").set_value(0.7)
    at.number_input(key="inspect_seed").set_value(5)
    at.toggle(key="inspect_dspark").set_value(True)
    at.switch_page("pages/architecture.py").run()     # the edits travel with the click that leaves the page
    assert not at.exception, at.exception
    at.switch_page("pages/inspect.py").run()
    assert not at.exception, at.exception
    assert at.text_area(key="inspect_prompt").value == "Not generated yet"
    assert at.number_input(key="inspect_max_new").value == 9
    assert at.number_input(key="inspect_temperature").value == 0.7
    assert at.number_input(key="inspect_seed").value == 5 and at.toggle(key="inspect_dspark").value is True


@pytest.mark.slow  # loads tiny-v4.1 and generates [~15 s]
def test_panel_token_and_filter_survive_another_page_and_the_diagram_paints_that_token():
    at = inspect_page(model="tiny-v4.1")
    at.text_area(key="inspect_prompt").input("The quick brown fox")
    at.number_input(key="inspect_max_new").set_value(8)
    at.button(key="inspect_generate").click().run()
    assert not at.exception, at.exception
    at.segmented_control(key="inspect_panel").set_value("Engram").run()
    at.selectbox(key="inspect_node").set_value("layers.1.engram").run()
    at.select_slider(key="inspect_token").set_value(5).run()
    at.switch_page("pages/compare.py").run()
    at.switch_page("pages/inspect.py").run()
    assert at.segmented_control(key="inspect_panel").value == "Engram"
    assert at.selectbox(key="inspect_node").value == "layers.1.engram"
    assert at.select_slider(key="inspect_token").value == 5
    assert query(at, "token") == "5" and query(at, "panel") == "Engram"
    # "in the diagram": the Architecture page paints this run at this token, Engram gates
    at.button(key="back_engram").click().run()
    assert not at.exception, at.exception
    assert at.toggle(key="arch_overlay").value is True
    assert at.selectbox(key="arch_overlay_token").value == 5 and at.selectbox(key="arch_overlay_metric").value == "gate"
    assert query(at, "otoken") == "5" and query(at, "node") == "layers.1.engram"
    at.switch_page("pages/inspect.py").run()     # and back: still token 5
    assert at.select_slider(key="inspect_token").value == 5


@pytest.mark.slow  # loads two tiny models [~10 s]
def test_the_url_names_the_model_picked_not_the_last_runs():
    at = inspect_page(model="tiny-v4.1")
    at.text_area(key="inspect_prompt").input("Hello")
    at.number_input(key="inspect_max_new").set_value(3)
    at.button(key="inspect_generate").click().run()
    assert query(at, "model") == "tiny-v4.1" and query(at, "prompt") == "Hello"
    at.selectbox(key="inspect_model").set_value("tiny-v4").run()
    assert not at.exception, at.exception
    assert query(at, "model") == "tiny-v4" and query(at, "prompt") is None


@pytest.mark.slow  # loads tiny-v4.1, generates and reruns [~15 s]
def test_what_if_starts_where_a_change_can_matter_and_says_why():
    """The page selects the last token the model read; a change there ("from this token on") could move only the
    final token, and usually moved nothing ("8 of 8 agree").
    The what-if now starts at the last prompt token, says why, and its rerun changes the baseline's log-probs."""
    at = inspect_page(model="tiny-v4.1")
    at.text_area(key="inspect_prompt").input("The quick brown fox")
    at.number_input(key="inspect_max_new").set_value(8)
    at.button(key="inspect_generate").click().run()
    assert not at.exception, at.exception
    toks = at.session_state["inspect_live_run"].trace.tokens(0)
    last, start = toks[-1].pos - 1, [t.pos for t in toks if not t.generated][-1]   # the last token the model read
    assert at.select_slider(key="inspect_token").value == last
    assert any(f"(position {last}) is the last the model read" in i.value and f"starts at position {start}" in i.value
               for i in at.info)
    change = next(m.value for m in at.markdown if "`ban-expert:" in m.value)
    assert f"@{start}-`" in change
    at.button(key="what_if_rerun").click().run()
    assert not at.exception, at.exception
    held = at.session_state["what_if"]
    baseline = [t.token_id for t in toks if t.generated]
    rerun = [t.token_id for t in held.run.trace.tokens(0) if t.generated]
    logp = [t.logprob for t in toks if t.generated], [t.logprob for t in held.run.trace.tokens(0) if t.generated]
    assert rerun != baseline or logp[0] != logp[1]      # something moved


@pytest.mark.slow  # Architecture page runs of tiny-v4.1 and a page visit [~12 s]
def test_accounting_tab_and_memory_plan_inputs_survive_another_page_and_are_in_the_url():
    at = architecture_page(config="tiny-v4.1")
    assert not at.exception, at.exception
    at.session_state["arch_accounting_tab"] = "Bytes"
    at.radio(key="plan_experts").set_value("in host RAM (one GPU)")
    at.number_input(key="plan_gpu_mem").set_value(80.0)
    at.number_input(key="plan_context").set_value(256).run()   # tiny-v4.1 reads 512
    assert not at.exception, at.exception
    assert (query(at, "tab"), query(at, "experts"), query(at, "gpu_mem"), query(at, "context")) == \
        ("Bytes", "host", "80", "256")
    at.switch_page("pages/compare.py").run()
    at.switch_page("pages/architecture.py").run()
    assert at.number_input(key="plan_context").value == 256 and at.number_input(key="plan_gpu_mem").value == 80.0
    assert at.radio(key="plan_experts").value == "in host RAM (one GPU)" and query(at, "tab") == "Bytes"
    # a fresh session opening the link sees the same inputs; a bad value is named and ignored
    other = architecture_page(config="tiny-v4.1", tab="Bytes", gpus="4", context="256", batch="0")
    assert not other.exception, other.exception
    assert other.number_input(key="plan_gpus").value == 4 and other.number_input(key="plan_context").value == 256
    assert other.session_state["arch_accounting_tab"] == "Bytes" and other.number_input(key="plan_batch").value == 1
    assert any("`batch=0` was ignored" in w.value for w in other.warning)


def compare_runs(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    for k, v in {"view": "Runs", **query}.items():
        at.query_params[k] = v
    at.switch_page("pages/compare.py")
    return at.run()


@pytest.mark.slow  # three Compare page runs and a page visit [~8 s]
def test_compare_runs_form_edits_survive_another_page_and_are_in_the_url():
    at = compare_runs()
    assert not at.exception, at.exception
    at.selectbox(key="compare_runs_a").set_value("tiny-v4.1")
    at.text_area(key="compare_runs_prompt").input("Two models, one prompt")
    at.number_input(key="compare_runs_max_new").set_value(7).run()
    assert (query(at, "ra"), query(at, "rprompt"), query(at, "rmax")) == ("tiny-v4.1", "Two models, one prompt", "7")
    at.toggle(key="compare_runs_dspark").set_value(True)
    at.switch_page("pages/architecture.py").run()     # the last edit travels with the click that leaves
    at.switch_page("pages/compare.py").run()
    assert at.text_area(key="compare_runs_prompt").value == "Two models, one prompt"
    assert at.number_input(key="compare_runs_max_new").value == 7 and at.toggle(key="compare_runs_dspark").value
    # a fresh session opening the link gets the same form (an out-of-range value is left at its default)
    other = compare_runs(ra="tiny-v4.1", rb="tiny-v4", rprompt="Shared", rmax="9999", rseed="3")
    assert not other.exception, other.exception
    assert (other.selectbox(key="compare_runs_a").value, other.selectbox(key="compare_runs_b").value) == \
        ("tiny-v4.1", "tiny-v4")
    assert other.text_area(key="compare_runs_prompt").value == "Shared"
    assert other.number_input(key="compare_runs_seed").value == 3 and other.number_input(
        key="compare_runs_max_new").value == 16
