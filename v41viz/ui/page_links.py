"""Buttons between the Architecture and Inspect pages: a diagram box opens its panel, a panel opens its box."""
from __future__ import annotations

import hashlib

import streamlit as st

from engine.spec.presets import list_presets

from ..inspect.links import architecture_query, panel_for
from .sidebar import CHOICE, UPLOADS, preset_named_for
from .url_state import UPLOAD_PREFIX

ARCH_JUMP = "arch_jump"          # node the architecture page selects on its next run
INSPECT_JUMP = "inspect_jump"    # (config key, node) the Inspect page filters to on its next run
# The Inspect page's runs and token choice in the session, which the Architecture page's overlay reads and seeds (named
# here because that page imports no engine module)
LIVE_RUN, LOADED_RUN, SHOWN_RUN = "inspect_live_run", "inspect_loaded_run", "inspect_shown"
INSPECT_TOKEN, INSPECT_TOKEN_RUN = "inspect_token", "inspect_token_run"
# {"source", "metric", "token"}: paint the diagram as an Inspect panel showed it
OVERLAY_REQUEST = "arch_overlay_request"
PANEL_METRIC = {"Experts": "load", "mHC": "gain", "Engram": "gate", "Attention": "attention", "DSpark": "acceptance"}


def diagram_config(choice_key: str, config_path, args) -> str:
    """The sidebar config key that draws an Inspect model: its preset name, the preset its checkpoint's config
    equals (a link anyone can open), or else that config registered as this session's upload."""
    if choice_key in list_presets():
        return choice_key
    if (preset := preset_named_for(args)) is not None:
        return preset
    key = UPLOAD_PREFIX + choice_key.split(":", 1)[-1] + ".json"
    st.session_state.setdefault(UPLOADS, {})[key] = (hashlib.sha256(str(config_path).encode()).hexdigest(), args)
    return key


def to_inspect_button(config_key: str, node: str) -> None:
    """On the architecture page: open the Inspect panel that shows this module's recorded data."""
    panel = panel_for(node)
    if panel is None:
        st.caption("Inspect has no live panel for this module (the trace records routing, mHC, Engram, "
                   "attention and DSpark facts).")
        return
    if st.button(f"Inspect `{node}` live → {panel} panel", key="to_inspect", icon=":material/monitoring:"):
        st.session_state[INSPECT_JUMP] = (config_key, node)
        st.switch_page("pages/inspect.py", query_params={"node": node, "panel": panel, "arch": config_key})


def to_diagram_button(config_key: str, node: str, key: str) -> None:
    """On the Inspect page: open the diagram box of the module a panel is showing."""
    if st.button(f"`{node}` in the diagram", key=key, icon=":material/account_tree:", type="tertiary"):
        st.session_state[CHOICE] = config_key
        st.session_state[ARCH_JUMP] = node
        # the diagram painted with the run shown here, at the panel's metric and the selected token
        metric = PANEL_METRIC.get(st.session_state.get("inspect_panel", ""), "load")
        token = st.session_state.get(INSPECT_TOKEN)
        st.session_state[OVERLAY_REQUEST] = {"source": st.session_state.get(SHOWN_RUN, "live"), "metric": metric,
                                             "token": token}
        paint = {"overlay": metric} | ({} if token is None else {"otoken": str(token)})
        st.switch_page("pages/architecture.py", query_params=architecture_query(config_key, node) | paint)
