"""The Compare page's run diff painted on run A's diagram: metric and aligned-token pickers, the drawing, a value."""
from __future__ import annotations

from functools import partial

import streamlit as st

from engine.spec.config import ModelArgs
from engine.trace import Trace

from ..arch.model_view import ModelView, build_view
from ..arch.paint import paint_svg
from ..inspect.overlay_diff import DIFF_METRICS, aligned_positions, diff_overlay
from ..inspect.run_diff import RunDiff
from .architecture_page import modules, unfolded_drawing
from .diagram_component import diagram as draw_diagram
from .diagram_component import picked
from .overlay_controls import run_args
from .plain_text import literal

METRIC, TOKEN, NODE = "compare_paint_metric", "compare_paint_token", "compare_paint_node"
ALL = -1
KEY = "compare_diagram"


@st.cache_resource(max_entries=4, show_spinner=False)
def _view(config_key: str, _args: ModelArgs) -> ModelView:
    return build_view(_args)


def diff_on_diagram(diff: RunDiff, a: Trace, b: Trace, model_a: str) -> None:
    """Run A's diagram painted with the chosen difference, for every token or one aligned token pair."""
    st.markdown("**On A's diagram** — the difference painted on the boxes of run A's model (B's layers matched by "
                "number)")
    args, config_key = run_args(model_a)
    if args is None:
        st.info(f"A's model ({literal(model_a or 'unnamed')}) is not one this server knows, so there is no diagram "
                "to paint; the tables above hold the same numbers.")
        return
    c = st.columns([2, 3])
    if st.session_state.get(METRIC) not in DIFF_METRICS:
        st.session_state[METRIC] = "agreement"
    metric = c[0].selectbox("Paint", list(DIFF_METRICS), key=METRIC, format_func=DIFF_METRICS.get)
    names = {ALL: "all tokens"} | {i: aligned_positions(diff, i)[2] for i in range(len(diff.tokens.table))}
    if st.session_state.get(TOKEN) not in names:
        st.session_state[TOKEN] = ALL
    index = c[1].selectbox("Token (aligned: prompt tokens by index, new tokens by step)", list(names), key=TOKEN,
                           format_func=names.get)
    painted = diff_overlay(diff, a, b, metric, None if index == ALL else index)
    view = _view(config_key, args)
    node = st.session_state.get(NODE) or ""
    if node not in view.graph:
        node = ""
    html = unfolded_drawing(config_key, view, modules(config_key, id(view), view), node, _focus(node, args))
    html, elsewhere = paint_svg(html, painted.fills(), painted.legend(), painted.title)
    off = [n for n in elsewhere if n.count(".") < 2]   # whole layers or stages A's model does not have
    gone = f" B's {', '.join(off)} {'has' if len(off) == 1 else 'have'} no box in A's model." if off else ""
    st.container(key="compare_paint_note").caption(
        f"**{literal(painted.title)}** — {literal(painted.note, 2000)}{gone} Click a box for its two values; a "
        "layer's box opens its modules on the right.")
    draw_diagram(html, key=KEY, on_pick=partial(_on_pick, KEY), on_toggle=lambda: None)
    cell = painted.cells.get(node)
    with st.container(key="compare_paint_value"):
        if cell is not None:
            st.markdown(f"`{node}` · **{literal(cell.text)}** — {literal(cell.detail, 2000)}")
        elif node:
            st.caption(f"`{node}` has no value for this metric.")


def _on_pick(key: str) -> None:
    st.session_state[NODE] = picked(key)


def _focus(node: str, args: ModelArgs) -> int:
    """The layer whose modules the drawing's detail column shows: the clicked one's (a draft stage counts after the
    backbone), else the first."""
    parts = node.split(".")
    if len(parts) >= 2 and parts[1].isdigit() and parts[0] in ("layers", "mtp"):
        layer = int(parts[1]) + (args.n_layers if parts[0] == "mtp" else 0)
        if layer < args.n_layers + args.n_draft_stages:
            return layer
    return 0
