"""The guard against a fragment rerun that arrives after its page was left (v41viz/ui/stale_fragment.py): the order
the browser sends them in when a text box still has the focus as a page link is clicked (the page change, then the
box's commit as a rerun of its fragment naming the old page). The browser test is
tests/browser/test_e2e_app_state.py (the Inspect prompt typed, then the sidebar link clicked)."""
from __future__ import annotations

from types import SimpleNamespace

from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.runtime.app_session import AppSession

from v41viz.ui import stale_fragment

INSPECT, ARCHITECTURE = "a" * 32, "b" * 32


def _request(page: str, fragment: str = "", prompt: str | None = None) -> ClientState:
    state = ClientState(page_script_hash=page, fragment_id=fragment)
    if prompt is not None:
        w = state.widget_states.widgets.add()
        w.id, w.string_value = f"$$ID-{'c' * 32}-inspect_prompt", prompt
        n = state.widget_states.widgets.add()
        n.id, n.int_value = f"$$ID-{'d' * 32}-inspect_max_new", 9
        unkeyed = state.widget_states.widgets.add()
        unkeyed.id, unkeyed.string_value = f"$$ID-{'e' * 32}-None", "no key"
    return state


def test_a_fragment_commit_after_the_page_change_is_dropped_and_its_values_kept(monkeypatch):
    seen = []
    monkeypatch.setattr(AppSession, "request_rerun", lambda self, state: seen.append(state))
    stale_fragment.install()
    session = SimpleNamespace(id="session-stale-test")
    rerun = AppSession.request_rerun
    rerun(session, _request(INSPECT))                                   # on Inspect
    rerun(session, _request(INSPECT, "frag", prompt="typed"))           # an edit there: runs
    rerun(session, _request(ARCHITECTURE))                              # the link's click
    rerun(session, _request(INSPECT, "frag", prompt="typed later"))     # the box's commit, after it: dropped
    assert [(s.page_script_hash, s.fragment_id) for s in seen] == [(INSPECT, ""), (INSPECT, "frag"),
                                                                   (ARCHITECTURE, "")]
    ctx = SimpleNamespace(session_id=session.id)
    monkeypatch.setattr(stale_fragment, "get_script_run_ctx", lambda: ctx)
    assert stale_fragment.take_late_edits() == {"inspect_prompt": "typed later", "inspect_max_new": 9}
    assert stale_fragment.take_late_edits() == {}   # once


def test_a_page_a_run_switched_to_takes_its_own_fragment_reruns(monkeypatch):
    """st.switch_page changes the page inside a run: the request named the old page, the run the new one
    (page_setup's page_shown), whose fragments then rerun as usual."""
    seen = []
    monkeypatch.setattr(AppSession, "request_rerun", lambda self, state: seen.append(state))
    stale_fragment.install()
    session = SimpleNamespace(id="session-switch-test")
    AppSession.request_rerun(session, _request(ARCHITECTURE))            # a button that calls st.switch_page
    monkeypatch.setattr(stale_fragment, "get_script_run_ctx",
                        lambda: SimpleNamespace(session_id=session.id, page_script_hash=INSPECT))
    stale_fragment.page_shown()                                          # the Inspect page's run
    AppSession.request_rerun(session, _request(INSPECT, "frag", prompt="x"))
    assert [s.fragment_id for s in seen] == ["", "frag"]


def test_a_first_request_that_names_no_page_drops_nothing():
    assert not stale_fragment.is_stale("frag", INSPECT, "")
    assert not stale_fragment.is_stale("", INSPECT, ARCHITECTURE)
    assert stale_fragment.is_stale("frag", INSPECT, ARCHITECTURE)
