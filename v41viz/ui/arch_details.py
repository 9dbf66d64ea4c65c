"""The architecture page's details panel: what the selected module or step does, its shapes, sizes, checkpoint
tensors and engine source."""
from __future__ import annotations

import streamlit as st

from ..arch.details import NodeDetails, display_table, human, node_details
from ..arch.model_view import ModelView
from ..arch.search import ModuleIndex
from ..arch.source import engine_code
from ..inspect.links import panel_for
from .overlay_controls import LiveOverlay, open_in_inspect
from .page_links import to_inspect_button
from .plain_text import literal, preformatted
from .static_table import show_table
from .url_state import ViewState


def details(config_key: str, view: ModelView, index: ModuleIndex, state: ViewState,
            live: LiveOverlay | None = None) -> None:
    node = state.node
    d = _node_details(config_key, id(view), node, state.expand, view, index)
    st.markdown(f"#### {d.doc.title}")
    if live is None:
        to_inspect_button(st.session_state.get("config_choice", view.args.name), node)
    else:
        live_value(live, node)
    st.markdown(f"`{d.node}` · {d.kind}" + (" · a step of `" + node.rsplit(".", 1)[0] + "`"
                                            if d.type.startswith("step:") else ""))
    st.markdown(f"*{d.doc.summary}*")
    if d.role_line:
        st.caption(d.role_line + (" " + d.group_line if d.group_line else ""))
    if d.reads:
        st.markdown(f"Reads the output of `{d.reads}`: this layer has no module of its own for it.")
    n_tensors = int(d.tensors["count"].sum()) if d.tensors is not None else 0
    st.markdown(f"**{human(d.params)}** parameters · **{human(d.nbytes, 'B')}** in the checkpoint · "
                f"**{n_tensors:,}** tensors"
                + (" (with submodules)" if d.type in ("block", "draft_block", "moe", "attention") else ""))
    st.markdown("**What it does.** " + d.doc.what)
    st.markdown("**Why it is there.** " + d.doc.why)
    if d.shapes:
        st.markdown("**Shapes** (B batch, S tokens in this call, T tokens cached so far)\n\n"
                    "| | | shape |\n|---|---|---|\n"
                    + "\n".join(f"| {io} | {what} | `{shape}` |" for io, what, shape in d.shapes))
    st.markdown("**Formula**")
    st.html(preformatted(d.doc.formula))
    if d.tensors is not None and len(d.tensors):
        st.markdown(f"**Checkpoint tensors** under `{d.node}` (routed experts folded into `{{i}}` rows)"
                    if not d.type.startswith("step:") else "**Checkpoint tensors** this step computes with")
        show_table(display_table(d.tensors, d.node.rsplit(".", 1)[0] if d.type.startswith("step:") else d.node),
                   scroll_height=320)
    src = engine_code(d.code)
    for piece in src.pieces:  # drawn when opened: the code highlighter is not part of the first view
        source = st.expander(f"Engine source: {piece.qualname}  ({piece.path}:{piece.first_line})", expanded=False,
                             key=f"source:{piece.qualname}", on_change="rerun")
        if source.open:
            source.code(piece.code, language="python", line_numbers=True)
    if src.message:
        st.info(f"Engine source: {src.message}.")
    elif not src.pieces:
        st.caption("Engine source: no engine code is mapped to this module.")


def live_value(live: LiveOverlay, node: str) -> None:
    """The painted value of the selected box, and the Inspect panel that shows the run's data for it at this layer
    (the same run, at the overlay's token)."""
    o = live.overlay
    cell = o.cells.get(node)
    with st.container(border=True, key="arch_live_value"):
        if cell is None:
            st.markdown(f":material/sensors: **Live data** · {literal(o.title)}: no value on `{node}` (painted: "
                        f"{o.painted} boxes).")
        else:
            st.markdown(f":material/sensors: **Live data** · {literal(o.title)}: **{literal(cell.text)}**")
            st.caption(literal(cell.detail, 2000))
        panel = panel_for(node)
        if panel is None:
            st.caption("Inspect has no live panel for this module.")
            return
        token = "" if live.pos is None else f", token at position {live.pos}"
        if st.button(f"Open `{node}` in Inspect → {panel} panel (this run{token})", key="overlay_to_inspect",
                     icon=":material/monitoring:"):
            open_in_inspect(live, node)


@st.cache_resource(max_entries=512, show_spinner=False)
def _node_details(config_key: str, view_id: int, node: str, expand: tuple[str, ...], _view: ModelView,
                  _index: ModuleIndex) -> NodeDetails:
    """A node's details depend on no session (view_id tells apart two uploads of the same name)."""
    return node_details(_view.args, _view.graph, _view.groups, node, frozenset(expand), _index.steps)
