"""AppTest of the Inspect page with the run store (issue 46): a run's link names it by its store id, and a new
session (a refresh, another tab, a restarted server: the store is on disk) opens the run itself, not a rerun; an
interrupted run shows the tokens it had; an id the store does not have is said, and the page works."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import inspect_page
from v41viz.inspect import run_store
from v41viz.inspect.run_store import RunStore


def text_of(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


@pytest.mark.slow  # loads the shipped model in the page and generates [17 s on 2 cores]
def test_a_link_opens_the_stored_run_itself_in_a_new_session():
    at = inspect_page()
    at.text_area(key="inspect_prompt").input("ROMEO:")
    at.number_input(key="inspect_max_new").set_value(4)
    at.button(key="inspect_generate").click()
    at.run()
    assert not at.exception, at.exception
    run_id = at.query_params["run"]
    entry = next(e for e in RunStore().runs() if e.run_id == run_id)
    assert (entry.status, entry.n_tokens, entry.model) == ("done", 4, "checkpoint:default")
    assert any("stored," in c.value and "least recently used go first" in c.value for c in at.caption)
    shown = at.session_state["inspect_live_run"].text

    again = inspect_page(run=run_id, panel="mHC")
    assert not again.exception, again.exception
    assert f":material/folder_open: loaded: stored run {run_id}" in text_of(again)
    assert "status: **stopped at max new tokens (4 tokens)**" in text_of(again)
    assert again.session_state["inspect_loaded_run"].text == shown
    assert not any(b.key == "inspect_offer_run" for b in again.button)    # the run itself: nothing to run again
    assert again.query_params["run"] == run_id



def test_a_run_interrupted_by_a_crash_opens_with_the_tokens_it_had(monkeypatch):
    """A run whose writer died mid-generation (its partial trace is all there is): the page shows its tokens and
    says it was interrupted."""
    from engine.trace import Trace, TraceBudget
    trace = Trace(TraceBudget(), meta={"config": "checkpoint:default", "prompt": "ROMEO:", "max_new_tokens": 24})
    trace.record_prompt(0, [5, 6], ["ROM", "EO:"])
    writer = RunStore().begin(trace, "checkpoint:default")
    for pos, text in ((2, " I"), (3, " am")):
        trace.record_token(0, pos, 7 + pos, text, step=pos - 2, step_time_s=0.01)
        writer.last = 0.0
        writer.tokens()
    monkeypatch.setattr(run_store, "_writing", set())     # the server that ran it is gone
    at = inspect_page(run=writer.run_id)
    assert not at.exception, at.exception
    assert "status: **interrupted after 2 tokens**" in text_of(at)
    assert at.session_state["inspect_loaded_run"].text == " I am"


def test_an_unknown_run_id_is_said_and_the_page_works():
    at = inspect_page(run="0123456789abcdef")
    assert not at.exception, at.exception
    assert any("run 0123456789abcdef is not in the run store" in e.value for e in at.error)
    bad = inspect_page(run="../../etc")
    assert any("`run=../../etc` was ignored: a run id is 16 hexadecimal digits" in w.value for w in bad.warning)
