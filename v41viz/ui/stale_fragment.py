"""A fragment rerun that reaches the server after the user left the fragment's page is dropped, and the edit it
carried is kept.

Why: a text box commits its value when it loses focus, in a React effect that runs after the click which took the
focus away. When that click is on a link to another page, the browser sends the page change first and the text box's
commit a few milliseconds later, as a rerun of the fragment the box is in, naming the page that was left. Streamlit
1.67 (AppSession.request_rerun) drops a rerun of a fragment it no longer holds, but the left page's fragments are
only let go at the end of the new page's run, so this one is queued behind it; it then switches the session back to
the left page, finds no fragment to run, and the browser, told the page changed, clears everything: the new page
comes up blank ("Couldn't find fragment with id …" in the server log). A slow click (the effect runs between mouse
down and up) or a box committed beforehand (Tab, Enter) does not race.

Here a fragment rerun that names another page than the one the session shows is dropped, as Streamlit drops a rerun
of a fragment that is gone. The page shown is the latest of: the page a full-run request asked for (the link's click,
known before any run starts) and the page a run drew (page_shown, from page_setup: a first visit's request may name no
page, and st.switch_page changes it inside a run). The values the dropped rerun carried for keyed widgets (the typed
prompt, a number not yet committed) are set aside per session, for kept.remember to keep on the next run."""
from __future__ import annotations

import logging
import threading

try:   # Streamlit's internals as of 1.67 (requirements.txt allows later versions: without them, no guard)
    from streamlit.proto.WidgetStates_pb2 import WidgetStates
    from streamlit.runtime.app_session import AppSession
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
    from streamlit.runtime.state.common import user_key_from_element_id
    MISSING = ""
except ImportError as e:   # pragma: no cover - depends on the installed Streamlit
    WidgetStates = AppSession = None
    MISSING = str(e)

    def get_script_run_ctx():
        return None

_lock = threading.Lock()
_late: dict[str, dict[str, object]] = {}   # session id → {widget key: value} from dropped reruns
_shown: dict[str, str] = {}                # session id → hash of the page it shows (or was last asked for)
_VALUE_KINDS = ("string_value", "int_value", "double_value", "bool_value")   # what a blur can commit, and toggles


def keyed_values(states) -> dict[str, object]:
    """{widget key: value} of the keyed widgets in a rerun request whose values are plain scalars."""
    values = {}
    for state in states.widgets:
        key = user_key_from_element_id(state.id)
        kind = state.WhichOneof("value")
        if key is not None and kind in _VALUE_KINDS:
            values[key] = getattr(state, kind)
    return values


def is_stale(fragment_id: str, request_page: str, shown_page: str) -> bool:
    """A fragment rerun is stale when it names a page and the session was since asked for another one."""
    return bool(fragment_id) and bool(request_page) and bool(shown_page) and request_page != shown_page


def page_shown() -> None:
    """Called by a page's full run (page_setup): this session shows that page now."""
    ctx = get_script_run_ctx()
    if ctx is not None and ctx.page_script_hash:
        with _lock:
            _shown[ctx.session_id] = ctx.page_script_hash


def take_late_edits() -> dict[str, object]:
    """The values this session's dropped reruns carried, once (in a script run)."""
    ctx = get_script_run_ctx()
    with _lock:
        return _late.pop(ctx.session_id, {}) if ctx is not None else {}


def install() -> None:
    """Wrap AppSession.request_rerun once per process (each page calls this through page_setup); where this
    Streamlit lacks the internals it wraps, say so once in the server log and leave it as it is."""
    if AppSession is None:
        if not getattr(install, "said", False):
            install.said = True
            logging.getLogger(__name__).warning("the stale-fragment guard is off with this Streamlit (%s): a link "
                                                "clicked while a text box has focus may show a blank page", MISSING)
        return
    if getattr(AppSession.request_rerun, "_v41_stale_fragment", False):
        return
    original = AppSession.request_rerun

    def request_rerun(self: AppSession, client_state) -> None:
        with _lock:
            if client_state is not None and not client_state.fragment_id and client_state.page_script_hash:
                _shown[self.id] = client_state.page_script_hash
            elif client_state is not None and is_stale(client_state.fragment_id, client_state.page_script_hash,
                                                       _shown.get(self.id, "")):
                _late.setdefault(self.id, {}).update(keyed_values(client_state.widget_states))
                return
        original(self, client_state)

    request_rerun._v41_stale_fragment = True
    AppSession.request_rerun = request_rerun
