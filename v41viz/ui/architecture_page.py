"""Streamlit pieces of the architecture page: URL/selection sync, header, search, diagram, details, accounting."""
from __future__ import annotations

from functools import partial

import streamlit as st

from engine.plan.fit import MAX_GPUS, fit_options, impossible_counts
from engine.plan.memory_plan import HOST_WORKING_FORMULA, WORKING_FORMULA, Hardware, memory_plan
from engine.spec.errors import InputError

from ..arch import accounting_panels as panels
from ..arch import plan_panels
from ..arch.details import human
from ..arch.diagram import diagram_html
from ..arch.layout import build_layout
from ..arch.model_view import ModelView, context_length
from ..arch.module_docs import describe
from ..arch.search import ModuleIndex, build_index
from ..arch.substep_docs import describe_step
from ..arch.substeps import OPENABLE
from . import arch_inputs, kept
from .diagram_component import diagram as draw_diagram
from .diagram_component import picked, toggled, viewed
from .overlay_controls import LiveOverlay, paint
from .page_links import ARCH_JUMP
from .plain_text import literal, preformatted
from .sidebar import config_label
from .start_page import terms_line
from .static_table import show_table
from .url_state import UPLOAD_PREFIX, ViewState, from_query, sanitize, to_query, zoom_text

NODE, EXPAND, OWNER, PICK = "arch_node", "arch_expand", "arch_state_config", "arch_pick"
OPEN, TOGGLE = "arch_open", "arch_toggle"          # opened boxes ('attn', 'ffn'); a clicked open/close control
SEARCH, FOUND, HIT = "arch_search", "arch_found", "arch_hit"   # the search box; its pick; which match is shown
CENTRE, LAST = "arch_centre", "arch_last_node"     # the drawing centres on the node when the counter moves
PLAN_CONTEXT, PLAN_CONTEXT_OWNER = "plan_context", "plan_context_config"   # the plan's context, and for whom
BESIDE = "arch_beside"                             # the details panel beside the diagram instead of below
ZOOM = "arch_zoom"                                 # {config key: the diagram's view, "percent,x,y"}: the URL's zoom
# Widget keys are dropped when the user visits another page; these plain keys keep the view meanwhile.
KEEP = {NODE: "arch_node_kept", EXPAND: "arch_expand_kept", BESIDE: "arch_beside_kept"}


@st.cache_resource(max_entries=16, show_spinner=False)
def modules(config_key: str, view_id: int, _view: ModelView) -> ModuleIndex:
    """Every selectable module and step of one model (~10 ms for V4.1-Flash; shared by all sessions)."""
    return build_index(_view.args, _view.graph)


def restore_kept() -> None:
    """Back from another page: the view's widgets get their kept values, before any of them is drawn (the details
    toggle is drawn above the part that sync_state runs in)."""
    for widget, held in KEEP.items():
        if widget not in st.session_state and held in st.session_state:
            st.session_state[widget] = st.session_state[held]


def sync_state(config_key: str, view: ModelView, index: ModuleIndex) -> ViewState:
    """Bring node/expansion/open state in line with the URL (first visit), a config change, a diagram click, a
    search, or an open/close control."""
    g, ids = view.graph, [gr.id for gr in view.foldable]
    jump = st.session_state.pop(ARCH_JUMP, None)  # a link back from an Inspect panel
    if jump in index:
        if st.session_state.get(OWNER) != config_key:
            st.session_state[EXPAND] = []
        st.session_state[NODE], st.session_state[OWNER] = jump, config_key
    if st.session_state.get(OWNER) != config_key or NODE not in st.session_state:
        url = from_query(st.query_params)
        first_visit = OWNER not in st.session_state
        wanted = url if first_visit and url.config == config_key else ViewState(config_key)
        clean, problems = sanitize(wanted, index, ids)
        st.session_state[NODE] = clean.node or f"layers.{view.default_focus()}.attn"
        # a linked node is centred, unless the link names the view too (its zoom)
        st.session_state[LAST] = "" if clean.node and not clean.zoom else st.session_state[NODE]
        st.session_state[EXPAND] = list(clean.expand)
        st.session_state[OPEN] = list(clean.open)
        st.session_state[OWNER] = config_key
        if clean.zoom:
            st.session_state.setdefault(ZOOM, {})[config_key] = clean.zoom
        for p in problems:
            st.warning(p)
    clicked = st.session_state.pop(PICK, None)
    if clicked in index:   # a click on the diagram (see _on_pick): a click on attention or MoE also opens it
        st.session_state[NODE] = clicked
        if clicked in g and (which := OPENABLE.get(g.nodes[clicked]["type"])):
            _set_open(which, True)
    if (found := st.session_state.pop(FOUND, None)) in index:   # the search box or its previous / next buttons
        st.session_state[NODE] = found
        st.session_state[LAST] = ""
    if (which := st.session_state.pop(TOGGLE, None)) in OPENABLE.values():
        _toggle(which, index)
    if st.session_state.get(NODE) not in index:
        st.session_state[NODE] = f"layers.{view.default_focus()}.attn"
    node = st.session_state[NODE]
    if (step := index.steps.get(node)) is not None and node not in g:   # a step is drawn only in its opened box
        _set_open(step.parent.rsplit(".", 1)[1], True)
    if node != st.session_state.get(LAST) and node != clicked:   # chosen outside the drawing: centre it
        st.session_state[CENTRE] = st.session_state.get(CENTRE, 0) + 1
    st.session_state[LAST] = node
    st.session_state[KEEP[NODE]], st.session_state[KEEP[EXPAND]] = node, list(st.session_state[EXPAND])
    st.session_state[KEEP[BESIDE]] = bool(st.session_state.get(BESIDE, False))
    return ViewState(config_key, node, tuple(sorted(st.session_state[EXPAND])),
                     tuple(sorted(st.session_state.get(OPEN, []))), st.session_state.get(ZOOM, {}).get(config_key, ""))


def _set_open(which: str, opened: bool) -> None:
    now = set(st.session_state.get(OPEN, []))
    st.session_state[OPEN] = sorted(now | {which} if opened else now - {which})


def _toggle(which: str, index: ModuleIndex) -> None:
    """Open or close the focused layer's attention / MoE; closing moves a selected step to its box."""
    opened = which not in st.session_state.get(OPEN, [])
    _set_open(which, opened)
    step = index.steps.get(st.session_state.get(NODE, ""))
    if not opened and step is not None and step.parent.endswith("." + which):
        st.session_state[NODE] = step.parent


def write_url(state: ViewState, extra: dict[str, str] | None = None) -> None:
    """The view's URL; extra: parameters of the live overlay (its metric and token). The accounting tab and the
    memory plan's inputs come along (arch_inputs: restored before anything is drawn)."""
    arch_inputs.restore()
    want = to_query(state) | arch_inputs.to_query() | (extra or {})
    if dict(st.query_params) != want:
        st.query_params.from_dict(want)


def header(config_key: str, view: ModelView) -> None:
    a, acc = view.args, view.accounting.to_json()
    uploaded = config_key.startswith(UPLOAD_PREFIX)      # its name is the user's file name: shown literally
    st.title(literal(config_label(config_key)) if uploaded else a.name)
    st.caption(f"{a.family.upper()} family · drawn from config.json (an illustration of the config; live data appear "
               "only where the Live data panel paints a run's facts on it)")
    cols = st.columns(6)
    cols[0].metric("parameters (total)", human(acc["params"]["total"]))
    cols[1].metric("activated / decode token", human(acc["params"]["activated_decode"]))
    cols[2].metric("layers + draft stages", f"{a.n_layers} + {a.n_draft_stages}")
    cols[3].metric("checkpoint", human(acc["bytes"]["checkpoint"], "B"))
    cols[4].metric("vocabulary", f"{a.vocab_size:,}")
    context, source = context_length(a)
    cols[5].metric("context", f"{context:,}", help=f"tokens, from {source}")
    st.markdown(" · ".join(_highlights(view)))
    st.caption(terms_line())   # the layer cards' labels (CSA, KV←n, idx←n, Reindex, …) are explained there


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
        out.append(f"DSpark drafter ({a.n_draft_stages} stages, block {a.dspark_block_size}, "
                   f"taps {list(a.dspark_target_layer_ids)})")
    elif a.n_draft_stages:
        out.append(f"{a.n_draft_stages} MTP layer(s)")
    return [f"**{x}**" for x in out]


def reading_guide() -> None:
    guide, beside = st.columns([0.8, 0.2], vertical_alignment="center")
    with guide.expander("Reading this diagram", expanded=False):
        st.markdown(
            "Data flows top to bottom; each arrow is labelled with the shape of what it carries (B batch, S tokens "
            "in this call, T tokens cached so far, γ the draft block). The middle column is the layer stack: a pile "
            "of cards with a **×N** badge is N consecutive layers with the same role (or an alternating pair), "
            "labelled with what they do (compression ratio, whose KV they read, which index list they use). The "
            "dotted frame on the right opens the layer that holds the selected module; the left column is the "
            "drafter (DSpark or MTP) fed by tapped layers. Solid arrows carry activations, dashed grey lines are the "
            "mHC residual streams, dotted lines attach auxiliary modules.\n\n"
            "Click the attention or MoE box of the opened layer (or its **+**) to open it into its steps: the query "
            "and KV projections, RoPE, where the compressed rows and the index list come from (a dashed box reads "
            "another layer's), the sparse attention with its sink and the grouped output; the router, the routed "
            "and shared experts and their combination. Each step has its own details. **Ctrl + wheel** zooms, "
            "drag pans, **Fit** shows everything; the buttons on the right download the drawing as SVG or PNG. "
            "Hover a box for its summary; click it (or find it by name) for the details. The URL keeps the config, "
            "the selection, the expanded groups and the opened boxes.")
    beside.toggle("Details beside the diagram", key=BESIDE,
                  help="Off: the diagram takes the full page width and the details follow below it.")


def details_beside() -> bool:
    return bool(st.session_state.get(BESIDE, False))


def controls(view: ModelView, index: ModuleIndex, painting: bool = False) -> None:
    """The search box (with previous / next over its matches), the module picker and the folded groups (all drawn
    unfolded while live data paints the diagram)."""
    c1, c2, c3, c4 = st.columns([2.3, 1.4, 2.9, 2.4], vertical_alignment="bottom")
    c1.text_input("Find a module", key=SEARCH, placeholder="layers.12.attn · indexer · engram · rope",
                  on_change=_on_search, args=(index,), help="Path or name; Enter selects the first match and "
                  "centres it in the drawing.")
    hits = index.find(st.session_state.get(SEARCH, ""))
    with c2.container(horizontal=True, vertical_alignment="center", gap="small"):
        # the label names the button for screen readers (an empty one was announced "chevron_left icon"); the
        # page CSS hides it from view (page_style.ICON_ONLY)
        st.button("Previous match", icon=":material/chevron_left:", key="arch_prev", help="previous match",
                  on_click=_next_hit, args=(index, -1), disabled=len(hits) < 2)
        st.button("Next match", icon=":material/chevron_right:", key="arch_next", help="next match",
                  on_click=_next_hit, args=(index, 1), disabled=len(hits) < 2)
        if st.session_state.get(SEARCH, "").strip():
            pos = st.session_state.get(HIT, 0) % len(hits) if hits else 0
            st.caption(f"{pos + 1} of {len(hits)}" if hits else "no match")
    c3.selectbox("Module", list(index.labels), key=NODE, format_func=lambda n: f"{n} — {index.labels[n]}")
    c4.multiselect("Expand folded groups", [gr.id for gr in view.foldable], key=EXPAND,
                   format_func=lambda i: next(gr.label for gr in view.foldable if gr.id == i),
                   placeholder="every layer is drawn while live data paints" if painting
                   else "show these groups layer by layer", disabled=painting)


def _on_search(index: ModuleIndex) -> None:
    hits = index.find(st.session_state.get(SEARCH, ""))
    st.session_state[HIT] = 0
    if hits:
        st.session_state[FOUND] = hits[0]


def _next_hit(index: ModuleIndex, step: int) -> None:
    hits = index.find(st.session_state.get(SEARCH, ""))
    if hits:
        st.session_state[HIT] = (st.session_state.get(HIT, 0) + step) % len(hits)
        st.session_state[FOUND] = hits[st.session_state[HIT]]


def diagram(config_key: str, view: ModelView, index: ModuleIndex, state: ViewState,
            live: LiveOverlay | None = None) -> None:
    """The drawing; with a live overlay every layer is drawn on its own (a folded group has no single value) and
    the boxes are painted with the run's values."""
    role = _role(view, index, state.node)
    focus = role.layer if role is not None else st.session_state.get("arch_focus", view.default_focus())
    st.session_state["arch_focus"] = focus
    key = f"diagram:{config_key}"
    expand = tuple(sorted(gr.id for gr in view.foldable)) if live is not None else state.expand
    html = _drawing(config_key, id(view), state.node, expand, focus, state.open, view, index)
    if live is not None:
        html = paint(html, live)
    draw_diagram(html, key=key, on_pick=partial(_on_pick, key), on_toggle=partial(_on_toggle, key),
                 centre=(state.node, st.session_state.get(CENTRE, 0)), zoom=state.zoom,
                 on_view=partial(_on_view, key, config_key))


def _role(view: ModelView, index: ModuleIndex, node: str):
    step = index.steps.get(node)
    return view.graph.nodes[step.parent if node not in view.graph else node]["role"]


def unfolded_drawing(config_key: str, view: ModelView, index: ModuleIndex, node: str, focus: int) -> str:
    """The diagram with every layer on its own and no box opened (what a painted overlay draws), shared with the
    Compare page's run diff."""
    expand = tuple(sorted(gr.id for gr in view.foldable))
    return _drawing(config_key, id(view), node, expand, focus, (), view, index)


def _on_pick(key: str) -> None:
    """Runs before the rerun a diagram click starts: sync_state selects the node if this model has it."""
    st.session_state[PICK] = picked(key)


def _on_toggle(key: str) -> None:
    st.session_state[TOGGLE] = toggled(key)


def _on_view(key: str, config_key: str) -> None:
    """The user zoomed or panned the drawing (reported once it rests): the URL's zoom follows."""
    if (text := zoom_text(viewed(key))) is not None:
        st.session_state.setdefault(ZOOM, {})[config_key] = text


@st.cache_resource(max_entries=256, show_spinner=False)
def _drawing(config_key: str, view_id: int, node: str, expand: tuple[str, ...], focus: int, opened: tuple[str, ...],
             _view: ModelView, _index: ModuleIndex) -> str:
    """The diagram's HTML for one view state; it depends on no session, so every session shares it. view_id tells
    apart two uploads of the same name."""
    a, g = _view.args, _view.graph
    lay = build_layout(a, g, _view.groups, set(expand), focus, _view.size_text, frozenset(opened))
    hover = {n: _hover(_view, _index, n) for n in {b.node for b in lay.boxes.values()}}
    return diagram_html(lay, node, hover, name=a.name)


def _hover(view: ModelView, index: ModuleIndex, node: str) -> str:
    g = view.graph
    if node in g:
        return view.hover_text(node, describe(g.nodes[node]["type"], view.args, g.nodes[node]["role"]).summary)
    step = index.steps[node]
    doc = describe_step(step.name, view.args, g.nodes[step.parent]["role"])
    shapes = " · ".join(f"{what} {shape}" for what, shape in step.outputs)
    return "\n".join(x for x in (step.title, doc.summary, f"out: {shapes}" if shapes else "") if x)


def accounting_tabs(view: ModelView) -> None:
    a, acc = view.args, view.accounting
    st.subheader("Accounting")
    st.caption("Exact sums over the checkpoint tensor inventory derived from the config "
               "(engine.accounting.accounting).")
    # Only the open tab is drawn (a tab switch reruns the page): the first view carries no chart of these tabs.
    tabs = st.tabs(list(arch_inputs.TABS), key=arch_inputs.TAB, on_change="rerun")
    if tabs[0].open:
        show_table(panels.reconciliation(acc), tabs[0])
        pub = panels.published(a)   # full width below: its "why" column needs the room (it overflowed a half)
        if len(pub):
            tabs[0].markdown("**Against the published figures**")
            show_table(pub, tabs[0])
        else:
            tabs[0].info("No published figures exist for this config; only the exact sums are shown.")
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
    """The memory plan of the selected config for the hardware typed in (same numbers as `python -m engine plan`),
    and what fits on GPUs of that size (`python -m engine plan --fit`)."""
    st.subheader("Memory plan")
    st.caption("Where the checkpoint, the KV caches and the working buffers go when this config is served on N GPUs "
               "(engine.plan.memory_plan; the CLI is `python -m engine plan`). Computed from the config — no live "
               "data; the weight bytes are the exact checkpoint bytes, the working buffers an estimate.")
    on_host = st.radio("routed experts", [arch_inputs.ON_GPUS, arch_inputs.ON_HOST], horizontal=True,
                       **kept.widget(arch_inputs.EXPERTS),
                       help="in host RAM: the routed experts (backbone and drafter) stay in host "
                       "memory and run on the CPU; attention, shared experts, router, embeddings, head and the rest "
                       "of the drafter are on one GPU") != arch_inputs.ON_GPUS
    cols = st.columns(5)
    gpus = cols[0].number_input("GPUs", 1, 256, **kept.widget("plan_gpus"), disabled=on_host,
                                help="one GPU with the routed experts in host RAM" if on_host else None)
    gpu_mem = cols[1].number_input("GPU memory (GiB)", 1.0, 4096.0, step=1.0, **kept.widget("plan_gpu_mem"))
    host_mem = cols[2].number_input("host memory (GiB)", 1.0, 65536.0, step=64.0, **kept.widget("plan_host_mem"))
    longest, source = context_length(view.args)
    owner = st.session_state.get(PLAN_CONTEXT_OWNER)
    if owner is not None and owner != config_key:   # another config: it starts at its own default
        st.session_state[PLAN_CONTEXT] = min(Hardware().context, longest)
    st.session_state[PLAN_CONTEXT_OWNER] = config_key
    st.session_state[PLAN_CONTEXT] = min(int(kept.value(PLAN_CONTEXT, Hardware().context)), longest)
    context = cols[3].number_input("context (tokens)", 1, longest, step=min(1024, longest), **kept.widget(PLAN_CONTEXT),
                                   help=f"at most {longest:,} tokens for this config ({source})")
    batch = cols[4].number_input("batch (sequences)", 1, 4096, **kept.widget("plan_batch"))
    hardware = Hardware(gpus=1 if on_host else int(gpus), gpu_mem_gib=float(gpu_mem), host_mem_gib=float(host_mem),
                        context=int(context), batch=int(batch), experts="host" if on_host else "device")
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
        st.html(preformatted("\n".join(WORKING_FORMULA + (HOST_WORKING_FORMULA if plan.host_working else ()))))
    fits_section(config_key, view, float(gpu_mem), float(host_mem), int(batch))


def fits_section(config_key: str, view: ModelView, gpu_mem: float, host_mem: float, batch: int) -> None:
    """What fits on GPUs of this size: every GPU count the layout allows × placement, at its longest context."""
    st.markdown(f"**What fits on GPUs of {gpu_mem:g} GiB with {host_mem:g} GiB host RAM** (fewest GPUs first; the "
                f"GPU count is the tensor/expert-parallel degree; each row at the longest context of 4k … the "
                f"config's maximum that fits; `python -m engine plan --fit`)")
    table, not_tried = _fits(config_key, id(view), gpu_mem, host_mem, batch, view)
    show_table(table)
    if not_tried:
        st.caption(f"Not tried: {not_tried}")


@st.cache_resource(max_entries=64, show_spinner=False)
def _fits(config_key: str, view_id: int, gpu_mem: float, host_mem: float, batch: int, _view: ModelView):
    """The "what fits" table and the GPU counts left out, for one config and hardware (shared by all sessions)."""
    options = fit_options(_view.args, gpu_mem, host_mem, batch=batch)
    return plan_panels.fit_table(options), impossible_counts(_view.args, MAX_GPUS)


@st.cache_resource(max_entries=64, show_spinner=False)
def _plan(config_key: str, view_id: int, hardware: Hardware, _view: ModelView):
    """The plan, its chart and its two tables for one config and hardware: the same for every session (~0.2 s)."""
    plan = memory_plan(_view.args, hardware)
    return plan, plan_panels.device_bars_html(plan), plan_panels.placement_table(plan), plan_panels.device_table(plan)
