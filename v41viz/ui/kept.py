"""Widget values that outlive a visit to another page. Streamlit drops the state of every widget the current page
does not draw, so each value is also copied into one plain session dict (KEPT) and put back before the widget is
drawn again. The copy is made at the start of every page's run (page_setup), which also catches an edit the user
made just before leaving (a typed prompt committed by the click on another page's link), and takes the values of an
edit whose commit reached the server only after the page changed (stale_fragment)."""
from __future__ import annotations

import streamlit as st

from . import stale_fragment

KEPT = "kept_widgets"
_tracked: set[str] = set()    # widget keys ever restored through this module (the same for every session)


def restore(defaults: dict[str, object], pending: dict[str, object] | None = None) -> None:
    """Before the widgets are drawn: each key Streamlit dropped gets its kept value, else its default; pending
    values (a loaded trace's settings, a link's) replace both."""
    kept = st.session_state.setdefault(KEPT, {})
    for key, default in defaults.items():
        _tracked.add(key)
        if pending and key in pending:
            st.session_state[key] = kept[key] = pending[key]
        elif key not in st.session_state:
            st.session_state[key] = kept.get(key, default)


def remember() -> None:
    """Copy every tracked widget value the session holds (called first on every page and after forms are drawn),
    then the tracked values of edits committed after their page was left (newer than any value held)."""
    kept = st.session_state.setdefault(KEPT, {})
    for key in _tracked:
        if key in st.session_state:
            kept[key] = st.session_state[key]
    kept.update({k: v for k, v in stale_fragment.take_late_edits().items() if k in _tracked})


def keep(key: str) -> None:
    """An on_change callback: the widget's new value is kept at once. Callbacks run before the script, even in the
    rerun that leaves the page (an edit committed by the click on another page's link, which the new page's run
    would drop before any page code sees it)."""
    if key in st.session_state:
        st.session_state.setdefault(KEPT, {})[key] = st.session_state[key]


def widget(key: str) -> dict:
    """A widget's keyword arguments: its key, and keep as its on_change (`st.number_input(..., **kept.widget(k))`)."""
    return {"key": key, "on_change": keep, "args": (key,)}


def value(key: str, default: object = None) -> object:
    """A tracked widget's value whether or not this page draws it."""
    return st.session_state.get(key, st.session_state.get(KEPT, {}).get(key, default))
