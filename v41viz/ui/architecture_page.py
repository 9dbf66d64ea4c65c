"""Streamlit pieces of the architecture page: URL/selection sync, header, diagram, details, accounting tabs."""
from __future__ import annotations

import streamlit as st

from engine.spec.errors import InputError
from engine.spec.memory_plan import WORKING_FORMULA, Hardware, memory_plan

from ..arch import accounting_panels as panels
from ..arch import plan_panels
from ..arch.details import display_table, human, node_details
from ..arch.diagram import build_figure
from ..arch.layout import build_layout
from ..arch.model_view import ModelView, context_length
from ..arch.module_docs import describe
from ..arch.source import engine_source
from .page_links import ARCH_JUMP, to_inspect_button
from .url_state import ViewState, from_query, sanitize, to_query

NODE, EXPAND, OWNER, PICK = "arch_node", "arch_expand", "arch_state_config", "arch_last_pick"
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
        st.session_state[NODE], st.session_state[OWNER], st.session_state[PICK] = jump, config_key, None
    if st.session_state.get(OWNER) != config_key or NODE not in st.session_state:
        url = from_query(st.query_params)
        first_visit = OWNER not in st.session_state
        wanted = url if first_visit and url.config == config_key else ViewState(config_key)
        clean, problems = sanitize(wanted, g, ids)
        st.session_state[NODE] = clean.node or f"layers.{view.default_focus()}.attn"
        st.session_state[EXPAND] = list(clean.expand)
        st.session_state[OWNER] = config_key
        st.session_state[PICK] = None
        for p in problems:
            st.warning(p)
    event = st.session_state.get(f"diagram:{config_key}")
    points = tuple(p.get("customdata") for p in (event or {}).get("selection", {}).get("points", []))
    if points and points != st.session_state.get(PICK) and points[0] in g:
        st.session_state[NODE] = points[0]
    st.session_state[PICK] = points
    st.session_state[KEEP[NODE]], st.session_state[KEEP[EXPAND]] = st.session_state[NODE], list(st.session_state[EXPAND])
    return ViewState(config_key, st.session_state[NODE], tuple(sorted(st.session_state[EXPAND])))


def write_url(state: ViewState) -> None:
    want = to_query(state)
    if dict(st.query_params) != want:
        st.query_params.from_dict(want)


def header(view: ModelView) -> None:
    a, acc = view.args, view.accounting.to_json()
    st.title(a.name or "uploaded config")
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
    fig = _figure(config_key, id(view), state.node, state.expand, focus, view)
    st.plotly_chart(fig, key=f"diagram:{config_key}", on_select="rerun", selection_mode="points",
                    config={"displayModeBar": False, "scrollZoom": False}, width="stretch")


@st.cache_resource(max_entries=256, show_spinner=False)
def _figure(config_key: str, view_id: int, node: str, expand: tuple[str, ...], focus: int, _view: ModelView):
    """The diagram for one view state; it depends on no session, so every session shares it (building one
    takes ~0.1 s). view_id tells apart two uploads of the same name; st.plotly_chart does not modify it."""
    a, g = _view.args, _view.graph
    lay = build_layout(a, g, _view.groups, set(expand), focus, _view.size_text)
    hover = {n: _view.hover_text(n, describe(g.nodes[n]["type"], a, g.nodes[n]["role"]).summary)
             for n in {b.node for b in lay.boxes.values()}}
    return build_figure(lay, node, hover)


def details(view: ModelView, state: ViewState) -> None:
    node = state.node
    d = node_details(view.args, view.graph, view.groups, node, frozenset(state.expand))
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
    st.code(d.doc.formula, language=None)
    if d.tensors is not None and len(d.tensors):
        st.markdown(f"**Checkpoint tensors** under `{d.node}` (routed experts folded into `{{i}}` rows)")
        table = display_table(d.tensors, d.node)
        if len(table) <= 12:  # small: a static table reads better (and its text is selectable)
            st.table(table.set_index("tensor"))
        else:
            st.dataframe(table, hide_index=True, width="stretch", height=320)
    src = engine_source(d.type)
    if src.found and view.args.family != "v4.1":
        st.caption("The engine runs the V4.1 family only; below is its V4.1 implementation of this kind of module.")
    for piece in src.pieces:
        with st.expander(f"Engine source: {piece.qualname}  ({piece.path}:{piece.first_line})", expanded=False):
            st.code(piece.code, language="python", line_numbers=True)
    if src.message:
        st.info(f"Engine source: {src.message}.")


def accounting_tabs(view: ModelView) -> None:
    a, acc = view.args, view.accounting
    st.subheader("Accounting")
    st.caption("Exact sums over the checkpoint tensor inventory derived from the config (engine.spec.accounting).")
    t1, t2, t3, t4, t5 = st.tabs(["Parameters", "Bytes", "KV cache per token", "Layer roles", "Experts touched"])
    with t1:
        left, right = st.columns(2)
        left.dataframe(panels.reconciliation(acc), hide_index=True, width="stretch")
        pub = panels.published(a)
        if len(pub):
            right.dataframe(pub, hide_index=True, width="stretch")
        else:
            right.info("No published figures exist for this config; only the exact sums are shown.")
        for note in acc.notes:
            st.caption(note)
    with t2:
        left, right = st.columns(2)
        left.dataframe(panels.bytes_by_format(acc), hide_index=True, width="stretch")
        right.dataframe(panels.bytes_by_kind(acc), hide_index=True, width="stretch")
    with t3:
        st.plotly_chart(panels.kv_figure(acc), width="stretch", config={"displayModeBar": False})
    with t4:
        st.dataframe(panels.role_table(a), hide_index=True, width="stretch")
    with t5:
        st.plotly_chart(panels.experts_touched_figure(a), width="stretch", config={"displayModeBar": False})
        st.caption("Closed form E·(1−(1−k/E)^B) for uniform routing, computed from the config (no live data on this "
                   "page). The distinct experts a real run read are measured on the Inspect page, Experts panel.")


def memory_plan_section(view: ModelView) -> None:
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
    try:
        plan = memory_plan(view.args, Hardware(gpus=int(gpus), gpu_mem_gib=float(gpu_mem),
                                               host_mem_gib=float(host_mem), context=int(context), batch=int(batch)))
    except InputError as e:
        st.warning(f"No plan for these inputs: {e}")
        return
    (st.success if plan.fits else st.warning)(plan.summary())
    st.plotly_chart(plan_panels.device_figure(plan), width="stretch", config={"displayModeBar": False})
    left, right = st.columns([0.72, 0.28])
    table = plan_panels.placement_table(plan)
    left.dataframe(table, hide_index=True, width="stretch", height=36 * (len(table) + 1),
                   column_config={"checkpoint bytes": st.column_config.NumberColumn(format="%d")})
    right.dataframe(plan_panels.device_table(plan), hide_index=True, width="stretch")
    with st.expander("How the plan is made", expanded=False):
        st.markdown("\n".join(f"- {note}" for note in plan.notes))
        st.markdown("**Working buffers per GPU**: " + ", ".join(
            f"{k} {human(v, 'B')}" for k, v in plan.working.items()))
        st.code("\n".join(WORKING_FORMULA), language=None)
