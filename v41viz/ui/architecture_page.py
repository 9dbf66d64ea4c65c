"""Streamlit pieces of the architecture page: URL/selection sync, header, diagram, details, accounting tabs."""
from __future__ import annotations

from functools import partial

import streamlit as st

from engine.spec.errors import InputError
from engine.spec.memory_plan import WORKING_FORMULA, Hardware, memory_plan

from ..arch import accounting_panels as panels
from ..arch import plan_panels
from ..arch.details import NodeDetails, display_table, human, node_details
from ..arch.diagram import diagram_html
from ..arch.layout import build_layout
from ..arch.model_view import ModelView, context_length
from ..arch.module_docs import describe
from ..arch.source import engine_source
from .diagram_component import diagram as draw_diagram
from .diagram_component import picked
from .page_links import ARCH_JUMP, to_inspect_button
from .plain_text import literal, preformatted
from .static_table import show_table
from .url_state import UPLOAD_PREFIX, ViewState, from_query, sanitize, to_query

NODE, EXPAND, OWNER, PICK = "arch_node", "arch_expand", "arch_state_config", "arch_pick"
# Widget keys are dropped when the user visits another page; these plain keys keep the view meanwhile.
KEEP = {NODE: "arch_node_kept", EXPAND: "arch_expand_kept"}


def sync_state(config_key: str, view: ModelView) -> ViewState:
    """Bring node/expansion widgets in line with the URL (first visit), a config change, or a diagram click."""
    g, ids = view.graph, [gr.id for gr in view.foldable]
    for widget, kept in KEEP.items():  # back from another page: restore the widgets from the kept values
        if widget not in st.session_state and kept in st.session_state:
            st.session_state[widget] = st.session_state[kept]
    jump = st.session_state.pop(ARCH_JUMP, None)  # a link back from an Inspect panel
    if jump in g:
        if st.session_state.get(OWNER) != config_key:
            st.session_state[EXPAND] = []
        st.session_state[NODE], st.session_state[OWNER] = jump, config_key
    if st.session_state.get(OWNER) != config_key or NODE not in st.session_state:
        url = from_query(st.query_params)
        first_visit = OWNER not in st.session_state
        wanted = url if first_visit and url.config == config_key else ViewState(config_key)
        clean, problems = sanitize(wanted, g, ids)
        st.session_state[NODE] = clean.node or f"layers.{view.default_focus()}.attn"
        st.session_state[EXPAND] = list(clean.expand)
        st.session_state[OWNER] = config_key
        for p in problems:
            st.warning(p)
    if (clicked := st.session_state.pop(PICK, None)) in g:   # a click on the diagram (see _on_pick)
        st.session_state[NODE] = clicked
    if st.session_state.get(NODE) not in g:
        st.session_state[NODE] = f"layers.{view.default_focus()}.attn"
    st.session_state[KEEP[NODE]], st.session_state[KEEP[EXPAND]] = st.session_state[NODE], list(st.session_state[EXPAND])
    return ViewState(config_key, st.session_state[NODE], tuple(sorted(st.session_state[EXPAND])))


def write_url(state: ViewState) -> None:
    want = to_query(state)
    if dict(st.query_params) != want:
        st.query_params.from_dict(want)


def header(config_key: str, view: ModelView) -> None:
    a, acc = view.args, view.accounting.to_json()
    uploaded = config_key.startswith(UPLOAD_PREFIX)      # its name is the user's file name: shown literally
    st.title((literal(a.name) if uploaded else a.name) or "uploaded config")
    st.caption(f"{a.family.upper()} family · drawn from config.json (an illustration of the config — no live data)")
    cols = st.columns(6)
    cols[0].metric("parameters (total)", human(acc["params"]["total"]))
    cols[1].metric("activated / decode token", human(acc["params"]["activated_decode"]))
    cols[2].metric("layers + draft stages", f"{a.n_layers} + {a.n_draft_stages}")
    cols[3].metric("checkpoint", human(acc["bytes"]["checkpoint"], "B"))
    cols[4].metric("vocabulary", f"{a.vocab_size:,}")
    context, source = context_length(a)
    cols[5].metric("context", f"{context:,}", help=f"tokens, from {source}")
    st.markdown(" · ".join(_highlights(view)))


def _highlights(view: ModelView) -> list[str]:
    a, out = view.args, []
    out.append(f"{a.n_routed_experts} routed + {a.n_shared_experts} shared experts, top-{a.n_activated_experts}")
    ratios = sorted({r for r in a.compress_ratios[: a.n_layers] if r})
    out.append("KV compression ratios " + "/".join(map(str, ratios)) if ratios else "window attention only")
    if a.kv_source_layers:
        out.append(f"shared KV sources {list(a.kv_source_layers)}")
    out.append(f"mHC ×{a.hc_mult} streams")
    if a.has_engram:
        out.append(f"Engram at layers {list(a.engram_layer_ids)}")
    if a.n_hash_layers:
        out.append(f"{a.n_hash_layers} hash-routed layers")
    if a.has_dspark:
        out.append(f"DSpark drafter ({a.n_draft_stages} stages, block {a.dspark_block_size}, taps {list(a.dspark_target_layer_ids)})")
    elif a.n_draft_stages:
        out.append(f"{a.n_draft_stages} MTP layer(s)")
    return [f"**{x}**" for x in out]


def reading_guide() -> None:
    with st.expander("Reading this diagram", expanded=False):
        st.markdown(
            "Data flows top to bottom. The middle column is the layer stack: a pile of cards with a **×N** badge is "
            "N consecutive layers with the same role (or an alternating pair), labelled with what they do "
            "(compression ratio, whose KV they read, which index list they use). The dotted frame on the right "
            "opens the layer that holds the selected module; the left column is the drafter (DSpark or MTP) fed "
            "by tapped layers. Solid arrows carry activations, dashed grey lines are the mHC residual streams, "
            "dotted lines attach auxiliary modules. Hover a box for its summary; click it (or pick it in the "
            "list) for the details. The URL keeps the config, the selection and the expanded groups.")


def controls(view: ModelView) -> None:
    g = view.graph
    c1, c2 = st.columns([3, 2])
    c1.selectbox("Module", list(g.nodes), key=NODE, format_func=lambda n: f"{n} — {g.nodes[n]['label']}")
    c2.multiselect("Expand folded groups", [gr.id for gr in view.foldable], key=EXPAND,
                   format_func=lambda i: next(gr.label for gr in view.foldable if gr.id == i),
                   placeholder="show these groups layer by layer")


def diagram(config_key: str, view: ModelView, state: ViewState) -> None:
    role = view.graph.nodes[state.node]["role"]
    focus = role.layer if role is not None else st.session_state.get("arch_focus", view.default_focus())
    st.session_state["arch_focus"] = focus
    key = f"diagram:{config_key}"
    html = _drawing(config_key, id(view), state.node, state.expand, focus, view)
    draw_diagram(html, key=key, on_pick=partial(_on_pick, key))


def _on_pick(key: str) -> None:
    """Runs before the rerun a diagram click starts: sync_state selects the node if this model has it."""
    st.session_state[PICK] = picked(key)


@st.cache_resource(max_entries=256, show_spinner=False)
def _drawing(config_key: str, view_id: int, node: str, expand: tuple[str, ...], focus: int, _view: ModelView) -> str:
    """The diagram's HTML for one view state; it depends on no session, so every session shares it. view_id tells
    apart two uploads of the same name."""
    a, g = _view.args, _view.graph
    lay = build_layout(a, g, _view.groups, set(expand), focus, _view.size_text)
    hover = {n: _view.hover_text(n, describe(g.nodes[n]["type"], a, g.nodes[n]["role"]).summary)
             for n in {b.node for b in lay.boxes.values()}}
    return diagram_html(lay, node, hover)


def details(config_key: str, view: ModelView, state: ViewState) -> None:
    node = state.node
    d = _node_details(config_key, id(view), node, state.expand, view)
    st.markdown(f"#### {d.doc.title}")
    to_inspect_button(st.session_state.get("config_choice", view.args.name), node)
    st.markdown(f"`{d.node}` · {d.kind}")
    st.markdown(f"*{d.doc.summary}*")
    if d.role_line:
        st.caption(d.role_line + (" " + d.group_line if d.group_line else ""))
    n_tensors = int(d.tensors["count"].sum()) if d.tensors is not None else 0
    st.markdown(f"**{human(d.params)}** parameters · **{human(d.nbytes, 'B')}** in the checkpoint · "
                f"**{n_tensors:,}** tensors" + (" (with submodules)" if d.type in ("block", "draft_block", "moe", "attention") else ""))
    st.markdown("**What it does.** " + d.doc.what)
    st.markdown("**Why it is there.** " + d.doc.why)
    st.markdown("**Formula**")
    st.html(preformatted(d.doc.formula))
    if d.tensors is not None and len(d.tensors):
        st.markdown(f"**Checkpoint tensors** under `{d.node}` (routed experts folded into `{{i}}` rows)")
        show_table(display_table(d.tensors, d.node), scroll_height=320)
    src = engine_source(d.type)
    for piece in src.pieces:  # drawn when opened: the code highlighter is not part of the first view
        source = st.expander(f"Engine source: {piece.qualname}  ({piece.path}:{piece.first_line})", expanded=False,
                             key=f"source:{piece.qualname}", on_change="rerun")
        if source.open:
            source.code(piece.code, language="python", line_numbers=True)
    if src.message:
        st.info(f"Engine source: {src.message}.")


@st.cache_resource(max_entries=512, show_spinner=False)
def _node_details(config_key: str, view_id: int, node: str, expand: tuple[str, ...], _view: ModelView) -> NodeDetails:
    """A node's details depend on no session (view_id tells apart two uploads of the same name)."""
    return node_details(_view.args, _view.graph, _view.groups, node, frozenset(expand))


def accounting_tabs(view: ModelView) -> None:
    a, acc = view.args, view.accounting
    st.subheader("Accounting")
    st.caption("Exact sums over the checkpoint tensor inventory derived from the config (engine.spec.accounting).")
    # Only the open tab is drawn (a tab switch reruns the page): the first view carries no chart of these tabs.
    tabs = st.tabs(["Parameters", "Bytes", "KV cache per token", "Layer roles", "Experts touched"],
                   key="arch_accounting_tab", on_change="rerun")
    if tabs[0].open:
        left, right = tabs[0].columns(2)
        show_table(panels.reconciliation(acc), left)
        pub = panels.published(a)
        if len(pub):
            show_table(pub, right)
        else:
            right.info("No published figures exist for this config; only the exact sums are shown.")
        for note in acc.notes:
            tabs[0].caption(note)
    if tabs[1].open:
        left, right = tabs[1].columns(2)
        show_table(panels.bytes_by_format(acc), left)
        show_table(panels.bytes_by_kind(acc), right)
    if tabs[2].open:
        tabs[2].plotly_chart(panels.kv_figure(acc), width="stretch", config={"displayModeBar": False})
    if tabs[3].open:
        tabs[3].dataframe(panels.role_table(a), hide_index=True, width="stretch")
    if tabs[4].open:
        tabs[4].plotly_chart(panels.experts_touched_figure(a), width="stretch", config={"displayModeBar": False})
        tabs[4].caption("Closed form E·(1−(1−k/E)^B) for uniform routing, computed from the config (no live data on "
                        "this page). The distinct experts a real run read are measured on the Inspect page, Experts "
                        "panel.")


def memory_plan_section(config_key: str, view: ModelView) -> None:
    """The memory plan of the selected config for the hardware typed in (same numbers as `python -m engine plan`)."""
    st.subheader("Memory plan")
    st.caption("Where the checkpoint, the KV caches and the working buffers go when this config is served on N GPUs "
               "(engine.spec.memory_plan; the CLI is `python -m engine plan`). Computed from the config — no live "
               "data; the weight bytes are the exact checkpoint bytes, the working buffers an estimate.")
    d, cols = Hardware(), st.columns(5)
    gpus = cols[0].number_input("GPUs", 1, 256, d.gpus, key="plan_gpus")
    gpu_mem = cols[1].number_input("GPU memory (GiB)", 1.0, 4096.0, d.gpu_mem_gib, step=1.0, key="plan_gpu_mem")
    host_mem = cols[2].number_input("host memory (GiB)", 1.0, 65536.0, d.host_mem_gib, step=64.0, key="plan_host_mem")
    context = cols[3].number_input("context (tokens)", 1, 16 * 2**20, d.context, step=1024, key="plan_context")
    batch = cols[4].number_input("batch (sequences)", 1, 4096, d.batch, key="plan_batch")
    hardware = Hardware(gpus=int(gpus), gpu_mem_gib=float(gpu_mem), host_mem_gib=float(host_mem),
                        context=int(context), batch=int(batch))
    try:
        plan, bars, table, devices = _plan(config_key, id(view), hardware, view)
    except InputError as e:
        st.warning(f"No plan for these inputs: {e}")
        return
    (st.success if plan.fits else st.warning)(plan.summary())
    st.html(bars)
    left, right = st.columns([0.72, 0.28])
    show_table(table, left)
    show_table(devices, right, scroll_height=400)
    with st.expander("How the plan is made", expanded=False):
        st.markdown("\n".join(f"- {note}" for note in plan.notes))
        st.markdown("**Working buffers per GPU**: " + ", ".join(
            f"{k} {human(v, 'B')}" for k, v in plan.working.items()))
        st.html(preformatted("\n".join(WORKING_FORMULA)))


@st.cache_resource(max_entries=64, show_spinner=False)
def _plan(config_key: str, view_id: int, hardware: Hardware, _view: ModelView):
    """The plan, its chart and its two tables for one config and hardware: the same for every session (~0.2 s)."""
    plan = memory_plan(_view.args, hardware)
    return plan, plan_panels.device_bars_svg(plan), plan_panels.placement_table(plan), plan_panels.device_table(plan)
