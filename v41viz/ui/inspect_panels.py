"""The Inspect panels in the page: module filter, token choice, and one view per panel (each labelled live or
loaded, each linking back to its diagram box)."""
from __future__ import annotations

import streamlit as st

from engine.trace import Trace, path_order

from ..inspect import attention_panel, dspark_panel, engram_panel, experts_panel, lens_panel, mhc_panel
from ..inspect.export import FORMATS, download_name, trace_bytes
from ..inspect.links import PANELS, diagram_node, filter_path, mhc_site, related
from ..inspect.run import LiveRun
from ..inspect.tokens import labels, token_detail_html, token_table
from ..inspect.trace_model import shown_text, trace_model
from . import inspect_link, kept
from .page_links import INSPECT_TOKEN as TOKEN
from .page_links import INSPECT_TOKEN_RUN as TOKEN_RUN
from .page_links import to_diagram_button
from .start_page import link
from .static_table import show_table

PANEL, NODE = "inspect_panel", "inspect_node"
NODE_OPTIONS = "inspect_node_options"   # the module filter's options of this run, for a heatmap click
CLICK_NOTE = ("Click a cell to select its token (and its layer as the module filter); the outlined column is the "
              "selected token. Hover a cell for its values; the experts chart colours each cell by its top expert.")
ALL = "(all modules)"
CHART = {"width": "stretch", "config": {"displayModeBar": False}}


def module_options(trace: Trace) -> list[str]:
    """Diagram node ids the trace has data for: layers, their FFN/attention/Engram modules and mHC seams."""
    nodes = set()
    for p in trace.paths("moe") + trace.paths("attention") + trace.paths("engram"):
        nodes |= {p, ".".join(p.split(".")[:2])}
    for p in trace.paths("mhc"):
        nodes |= {p, f"{p}.hc_attn", f"{p}.hc_ffn"}
    return [ALL] + sorted(nodes, key=path_order)


def selection(run: LiveRun, args, model: str) -> tuple[str, str | None, int]:
    """(panel, node filter or None, token position) from widgets, seeded by a link or a diagram jump (a node
    this run lacks is said, with the nearest one of its kind offered)."""
    trace = run.trace
    options = module_options(trace)
    st.session_state[NODE_OPTIONS] = options
    positions = sorted({pos for _, _, r, pos, _ in trace.facts("mhc") + trace.facts("moe") if r == 0})
    kept.restore({PANEL: PANELS[0], NODE: ALL, TOKEN: None})   # back from another page: the same view
    if (wanted := inspect_link.node_request(args, model, options)) is not None:
        st.session_state[NODE] = wanted
    if st.session_state.get(PANEL) not in PANELS:
        st.session_state[PANEL] = PANELS[0]
    if st.session_state.get(NODE) not in options:
        st.session_state[NODE] = ALL
    token = selected_token(run, positions)
    if st.session_state.get(TOKEN) != token:  # set only on change: a set value overrides the slider mid-drag
        st.session_state[TOKEN] = token
    st.segmented_control("Panel", PANELS, key=PANEL, required=True,   # (a row of its own: six panels)
                         help=f"What the model recorded on each token: the routed experts (some V4 layers are "
                              f"{link('hash-routed')}), the {link('mHC')} seams, {link('Engram')} lookups, "
                              f"{link('DSpark')} drafts, the logit lens and attention.")
    c2, c3 = st.columns([2, 3])
    c2.selectbox("Module filter", options, key=NODE, help="the diagram box whose data the panels show",
                 on_change=lambda: st.session_state.pop(inspect_link.REQUEST, None))
    names = dict(zip(positions, labels(trace, 0, positions)))
    if positions:
        c3.select_slider("Token", positions, key=TOKEN, format_func=lambda p: names[p])
    node = st.session_state[NODE]
    return st.session_state[PANEL], None if node == ALL else node, st.session_state[TOKEN]


def selected_token(run: LiveRun, positions: list[int]) -> int:
    """The one selected token position, which the slider, the URL and every panel show. A new run starts at its
    last token (a link's token applies to the first run the page shows); a position the run lacks is clamped."""
    last = positions[-1] if positions else 0
    if st.session_state.get(TOKEN_RUN) != run.serial:
        st.session_state[TOKEN_RUN] = run.serial
        linked = inspect_link.take_view("token")
        if linked is None:
            return last
        if linked in positions:
            return linked
        first = positions[0] if positions else 0
        st.warning(f"The link's token {linked} is not a position of this run (positions {first}"
                   f"–{last}); the nearest one is selected.", icon=":material/link_off:")
        return min(positions, key=lambda p: abs(p - linked), default=0)
    chosen = st.session_state.get(TOKEN)
    if chosen is None:
        return last
    return chosen if chosen in positions else min(positions, key=lambda p: abs(p - chosen), default=0)


def heatmap(fig, key: str) -> None:
    """A token × layer (or stream) heatmap whose cells select: a click on a cell selects its token, and its layer
    as the module filter where the filter has it (Streamlit's plotly selection event)."""
    st.plotly_chart(fig, key=key, on_select=lambda: _pick_cell(key), selection_mode="points", **CHART)
    st.caption(CLICK_NOTE)


def _pick_cell(key: str) -> None:
    points = st.session_state[key]["selection"]["points"]
    if not points:
        return
    x, y = str(points[0].get("x", "")), str(points[0].get("y", ""))
    head = x.split(":", 1)[0]   # an axis label is '<position>:<text>' (tokens.token_label)
    if head.isdigit():
        st.session_state[TOKEN] = int(head)
    layer = y.split(" ", 1)[0]  # 'layers.3.ffn (hash-routed)' → 'layers.3.ffn'
    if layer in st.session_state.get(NODE_OPTIONS, ()):
        st.session_state[NODE] = layer


def token_detail(run: LiveRun, pos: int, token_text) -> None:
    """The selected token's text, probability under the model and top-k alternatives, under the selector."""
    st.container(key="inspect_token_detail").html(token_detail_html(run.trace, 0, pos, token_text))


def header(run: LiveRun, config_key: str | None, node: str | None, what: str, key: str) -> None:
    c1, c2 = st.columns([3, 1])
    label = (":material/sensors: live data from this session's generation" if run.source == "live"
             else f":material/folder_open: {run.source} (a saved trace, not a live run) · drawn from the trace "
                  f"of {run.model or 'an unnamed model'}")
    c1.caption(f"{label} · {what}")
    if node and config_key:
        with c2:
            to_diagram_button(config_key, node, key)


def experts(run: LiveRun, config_key: str | None, node: str | None, pos: int) -> None:
    trace, only = run.trace, filter_path(node) if node else None
    facts = trace_model(trace)
    if not trace.paths("moe"):
        st.info("This trace has no MoE routing records.")
        return
    header(run, config_key, node or (experts_panel.moe_paths(trace) or [None])[0], "MoE routing", "back_experts")
    heatmap(experts_panel.choice_heatmap(trace, 0, only, facts.n_routed_experts, pos), "experts_heatmap")
    left, right = st.columns(2)
    left.plotly_chart(experts_panel.load_figure(trace, facts.n_routed_experts, only), key="experts_load", **CHART)
    right.plotly_chart(experts_panel.touched_figure(trace), key="experts_touched", **CHART)
    right.caption("Measured: distinct experts per backbone layer read by B consecutive tokens of this run.")
    st.markdown(f"**Top-{facts.n_activated_experts} per layer for token {labels(trace, 0, [pos])[0]}**")
    st.dataframe(experts_panel.token_topk(trace, 0, pos), hide_index=True, width="stretch")


def mhc(run: LiveRun, config_key: str | None, node: str | None, pos: int) -> dict[str, str]:
    trace = run.trace
    layers = [p for p in trace.paths("mhc") if related(p, filter_path(node) if node else None)] or trace.paths("mhc")
    if not layers:
        st.info("This trace has no mHC records.")
        return {}
    _seed("mhc_layer", inspect_link.take_view("layer"), layers)
    _seed("mhc_site", inspect_link.take_view("seam"), ["attn", "ffn"])
    c1, c2 = st.columns([3, 1])
    layer = c1.select_slider("Layer", layers, key="mhc_layer") if len(layers) > 1 else layers[0]
    site = mhc_site(node) if node and mhc_site(node) else c2.radio("Seam", ["attn", "ffn"], horizontal=True,
                                                                   key="mhc_site")
    header(run, config_key, diagram_node("mHC", layer, site), "mHC mixing", "back_mhc")
    left, right = st.columns(2)
    left.plotly_chart(mhc_panel.matrix_figure(trace, layer, site, 0, pos), key="mhc_matrix", **CHART)
    right.plotly_chart(mhc_panel.pre_post_figure(trace, layer, site, 0, pos), key="mhc_prepost", **CHART)
    left, right = st.columns(2)
    left.plotly_chart(mhc_panel.residual_figure(trace), key="mhc_residuals", **CHART)
    right.plotly_chart(mhc_panel.gain_figure(trace, 0, pos), key="mhc_gain", **CHART)
    return {"layer": layer, "seam": site}


def engram(run: LiveRun, config_key: str | None, node: str | None, pos: int) -> dict[str, str]:
    trace = run.trace
    paths = engram_panel.engram_paths(trace, filter_path(node) if node else None) or engram_panel.engram_paths(trace)
    if not paths:
        st.info("This trace has no Engram records (the model has no Engram layers).")
        return {}
    linked = inspect_link.take_view("layer")
    _seed("engram_path", f"{linked}.engram" if linked else None, paths)
    path = st.radio("Engram layer", paths, horizontal=True, key="engram_path") if len(paths) > 1 else paths[0]
    header(run, config_key, path, "Engram memory", "back_engram")
    st.markdown("**Text shaded by the mean gate** (hover a token for its value)")
    st.html(engram_panel.gated_text_html(trace, path))
    heatmap(engram_panel.gate_figure(trace, path, pos=pos), "engram_gates")
    left, right = st.columns([2, 3])
    rec = trace.fact("engram", path, 0, pos)
    with left:
        st.markdown(f"**Hashed rows for token {labels(trace, 0, [pos])[0]}**")
        if rec is None:
            st.info("No Engram record at this token.")
        else:
            st.caption(f"compressed token id {int(rec['compressed_ids'])}; rows by n-gram order × head")
            st.dataframe(engram_panel.rows_table(trace, trace_model(trace), path, 0, pos), width="stretch")
    right.dataframe(engram_panel.token_summary(trace, path), hide_index=True, width="stretch", height=300)
    return {"layer": ".".join(path.split(".")[:2])}


def _seed(key: str, value: str | None, options: list[str]) -> None:
    """Put a link's choice into a widget's key (once), and drop a kept value the options no longer hold (a value
    kept from an earlier visit of the page comes back first)."""
    kept.restore({key: None})
    if value is not None and value in options:
        st.session_state[key] = value
    elif st.session_state.get(key) not in options:
        del st.session_state[key]


def dspark(run: LiveRun, config_key: str | None, token_text) -> None:
    trace = run.trace
    if not trace.dspark_steps:
        st.info("No DSpark steps in this run: turn DSpark on in the settings and generate again.")
        return
    header(run, config_key, "mtp.0", "DSpark speculative steps", "back_dspark")
    m = dspark_panel.metrics(trace, 0)
    c = st.columns(4)
    c[0].metric("steps", m.steps)
    c[1].metric("mean accepted length", f"{m.mean_accepted_length:.2f}")
    c[2].metric("acceptance rate", f"{m.acceptance_rate:.2f}")
    c[3].metric("tokens / target forward", f"{m.tokens_per_forward:.2f}")
    token_text = shown_text(token_text)
    st.html(dspark_panel.steps_html(trace, token_text))
    st.caption("Boxed: the anchor. Green: accepted, red: rejected, grey: not verified; → the target's token.")
    left, mid, right = st.columns(3)
    left.plotly_chart(dspark_panel.accepted_trace_figure(trace), key="dspark_trace", **CHART)
    mid.plotly_chart(dspark_panel.accepted_histogram(trace), key="dspark_hist", **CHART)
    right.plotly_chart(dspark_panel.acceptance_figure(m), key="dspark_accept", **CHART)
    with st.expander("Every step"):
        st.dataframe(dspark_panel.steps_table(trace, token_text), hide_index=True, width="stretch")


def attention(run: LiveRun, config_key: str | None, node: str | None, pos: int) -> None:
    trace, only = run.trace, filter_path(node) if node else None
    if not trace.paths("attention"):
        st.info("Attention facts are opt-in: turn on 'trace attention' and generate again.")
        return
    header(run, config_key, node or trace.paths("attention")[0], "attention (opt-in)", "back_attention")
    st.plotly_chart(attention_panel.share_figure(trace, 0, only), key="attn_share", **CHART)
    chosen = attention_panel.chosen_positions(trace, 0, pos)
    if len(chosen):
        st.plotly_chart(attention_panel.chosen_figure(trace, 0, pos), key="attn_chosen", **CHART)
        st.dataframe(chosen, hide_index=True, width="stretch")
    else:
        st.info("No indexer picks at this token (too few compressed entries yet, or no indexed layer).")


def lens(run: LiveRun, config_key: str | None, node: str | None, pos: int, token_text) -> None:
    """The logit lens at the selected token (layers down), the residual-stream RMS per layer, and the tokens'
    log-probabilities."""
    trace = run.trace
    if not trace.paths("lens"):
        why = ("generate again to record it" if run.source == "live" else
               "this trace was saved without it (older traces, or a run with the lens off or on several ranks)")
        st.info(f"This run has no logit-lens records: {why}.")
        st.plotly_chart(lens_panel.logprob_figure(trace, 0, pos), key="lens_logprobs", **CHART)
        return
    paths = lens_panel.lens_paths(trace, filter_path(node) if node else None)
    header(run, config_key, "head", "logit lens: each layer's streams read out through the final norm and head",
           "back_lens")
    token_text = shown_text(token_text)
    table = lens_panel.lens_table(trace, 0, pos, token_text, paths)
    if table.empty:
        st.info(f"No lens records at token {labels(trace, 0, [pos])[0]}.")
    else:
        st.markdown(f"**What each layer predicts after {labels(trace, 0, [pos], 24)[0]}** (its streams collapsed as "
                    "the model collapses its last layer's, then the final norm and the head)")
        show_table(table, st.container(key="lens_table"))
        left, right = st.columns(2)
        left.plotly_chart(lens_panel.lens_figure(trace, 0, pos, token_text, paths), key="lens_layers", **CHART)
        right.plotly_chart(lens_panel.norm_figure(trace, 0, pos, paths), key="lens_norms", **CHART)
    heatmap(lens_panel.next_token_heatmap(trace, 0, paths, pos), "lens_heatmap")
    st.plotly_chart(lens_panel.logprob_figure(trace, 0, pos), key="lens_logprobs", **CHART)
    st.caption("V4.1 reads a layer out with the `pre` weights its next consumer would collapse with (the next layer's "
               "attention, or the final read-out); V4 with its learned `hc_head`. RMS: each hc stream's root mean "
               "square over dim, entering the layer (after its Engram, where it has one) and leaving it.")


def tokens(run: LiveRun, token_text) -> None:
    with st.expander("Tokens (text, id, probability under the model, top-k alternatives, step time)"):
        st.caption("Prompt tokens: the probability the model gave each one given the tokens before it "
                   "(teacher-forced, from the prompt's logits). Generated tokens: the probability in the distribution "
                   "they were drawn from, before temperature and top-k/top-p. Spaces show as ·, line breaks as ⏎.")
        st.dataframe(token_table(run.trace, 0, token_text), hide_index=True, width="stretch")


def export(run: LiveRun) -> None:
    """Download the shown trace as JSON, a zip of Parquet tables, or safetensors (one format built at a time)."""
    c1, c2 = st.columns([1, 2])
    fmt = c1.selectbox("Export format", list(FORMATS), key="export_format",
                       format_func=lambda f: {"json": "JSON", "parquet": "Parquet tables (zip)",
                                              "safetensors": "safetensors"}[f])
    cache = st.session_state.setdefault("export_cache", {})
    key = (id(run.trace), run.n_tokens, run.status, fmt)
    if key not in cache:
        cache.clear()
        cache[key] = trace_bytes(run.trace, fmt)
    mime = FORMATS[fmt][1]
    name = download_name(run.model, run.prompt or run.source, run.started_at, fmt)
    with c2:
        st.download_button(f"Download {name} ({len(cache[key]) / 1024:.0f} KiB)", cache[key], file_name=name,
                           mime=mime, key="export_download", icon=":material/download:", on_click="ignore")
        st.caption("Parquet: one table per fact kind (moe, mhc, engram, attention, tokens, dspark, lens) readable by "
                   "pandas/polars; every format loads back with `Trace.load` or the uploader above.")
