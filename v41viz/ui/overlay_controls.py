"""The Architecture page's "Live data" control: the run, metric and token that paint the diagram, and its links."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import streamlit as st

from engine.spec.config import ModelArgs, load_config
from engine.spec.presets import list_presets
from engine.trace import Trace

from ..arch.model_view import ModelView
from ..arch.paint import paint_svg
from ..inspect.export import trace_from_upload
from ..inspect.links import panel_for
from ..inspect.overlay import METRICS, Overlay, overlay, token_label
from . import engine_session
from .page_links import (
    INSPECT_JUMP,
    INSPECT_TOKEN,
    INSPECT_TOKEN_RUN,
    LIVE_RUN,
    LOADED_RUN,
    OVERLAY_REQUEST,
    SHOWN_RUN,
    diagram_config,
)
from .plain_text import literal, load_failure
from .sidebar import CHOICE, args_for

ON, METRIC, TOKEN, SOURCE = "arch_overlay", "arch_overlay_metric", "arch_overlay_token", "arch_overlay_source"
KEEP = {ON: "arch_overlay_kept", METRIC: "arch_overlay_metric_kept", TOKEN: "arch_overlay_token_kept",
        SOURCE: "arch_overlay_source_kept"}      # widget keys are dropped on other pages; these keep the choice
UPLOADED = "arch_overlay_upload"     # (digest, file name, Trace or None, error)
FOLLOWED = "arch_overlay_followed"   # the run whose config the page last switched to
NOTICE = "arch_overlay_notice"       # said once after switching the drawn config
MEMO = "arch_overlay_memo"           # (run identity, metric, token) → Overlay, for repaints without recomputing
PENDING = "arch_overlay_pending"     # widget values to set before the widgets are drawn (after a trace is loaded)
SEEN = "arch_overlay_seen"           # the latest run the page has seen: a newer one turns Live data on by itself
ALL = -1                              # the token picker's "all tokens"
URL_METRIC, URL_TOKEN = "overlay", "otoken"


@dataclass(frozen=True)
class Source:
    key: str          # "live" | "loaded" | "upload"
    label: str
    trace: Trace
    model: str        # the model key that made the run ('checkpoint:default', 'tiny-v4.1', …)
    name: str = ""    # the uploaded file's name
    serial: int = 0   # the Inspect run's serial (0: a trace loaded here)
    digest: str = ""  # the loaded file's digest

    @property
    def ident(self) -> tuple:
        """Tells one run from another (a new Inspect run has a new serial, a new file a new digest)."""
        return self.key, self.serial, self.digest, len(self.trace.tokens(0))


@dataclass(frozen=True)
class LiveOverlay:
    """What the page paints: the run, the overlay of the chosen metric and token, the config drawn for it."""
    source: Source
    overlay: Overlay
    pos: int | None
    note: str = ""     # said beside the diagram (the run's model is not one this server knows, …)


def sources() -> list[Source]:
    """The runs that can paint the diagram: Inspect's finished live run and loaded trace, a trace loaded here."""
    out = []
    runs = [("live", st.session_state.get(LIVE_RUN)), ("loaded", st.session_state.get(LOADED_RUN))]
    for key, run in sorted(runs, key=lambda kr: -getattr(kr[1], "started", 0.0)):   # the latest first
        if run is None or not run.trace.tokens(0):
            continue
        if run.active:
            st.caption(f":material/hourglass_top: Inspect's run of {literal(run.model)} is still generating "
                       f"({run.n_tokens} tokens so far); it can paint this diagram once it has ended.")
            continue
        what = "live run" if key == "live" else run.source
        out.append(Source(key, f"Inspect's {what} · {run.model or 'unknown model'} · {run.n_tokens} new tokens",
                          run.trace, run.model, serial=run.serial))
    held = st.session_state.get(UPLOADED)
    if held is not None and held[2] is not None:
        trace = held[2]
        out.append(Source("upload", f"loaded here: {held[1]} · {trace.meta.get('config') or 'unknown model'}",
                          trace, str(trace.meta.get("config", "")), name=held[1], digest=held[0]))
    return out


def _restore(found: list[Source]) -> None:
    """Widgets back from their kept values (a visit to another page), or, on the session's first view, from the URL.
    An Inspect panel's "in the diagram" asks for its run, metric and token; a run newer than the page last saw turns
    Live data on (once: the user may turn it off again)."""
    if (asked := st.session_state.pop(OVERLAY_REQUEST, None)) is not None:
        st.session_state.setdefault(PENDING, {}).update(
            {ON: True, SOURCE: asked["source"], METRIC: asked["metric"],
             TOKEN: ALL if asked["token"] is None else asked["token"]})
    if found and st.session_state.get(SEEN) != found[0].ident:
        st.session_state[SEEN] = found[0].ident
        if found[0].key != "upload":
            st.session_state.setdefault(PENDING, {}).setdefault(ON, True)
            st.session_state[PENDING].setdefault(SOURCE, found[0].key)
    for widget, value in st.session_state.pop(PENDING, {}).items():
        st.session_state[widget] = st.session_state[KEEP[widget]] = value
    if KEEP[ON] not in st.session_state and st.query_params.get(URL_METRIC) in METRICS:
        st.session_state[KEEP[ON]], st.session_state[KEEP[METRIC]] = True, st.query_params[URL_METRIC]
        token = st.query_params.get(URL_TOKEN, "")
        st.session_state[KEEP[TOKEN]] = int(token) if token.isdigit() else ALL
    for widget, kept in KEEP.items():
        if widget not in st.session_state and kept in st.session_state:
            st.session_state[widget] = st.session_state[kept]


def _keep() -> None:
    for widget, kept in KEEP.items():
        if widget in st.session_state:
            st.session_state[kept] = st.session_state[widget]


def live_data(config_key: str, view: ModelView) -> LiveOverlay | None:
    """The "Live data" control above the diagram; the overlay to paint, or None (off, or no run yet)."""
    with st.container(border=True, key="arch_live"):
        found = sources()
        _restore(found)
        if not found:
            st.markdown(":material/sensors: **Live data** · no run yet: generate on the **Inspect** page (or load a "
                        "saved trace below), and this diagram is painted with what the model did — expert load, "
                        "routing entropy, Engram gates, mHC gains, attention split, DSpark acceptance.")
            _files()
            return None
        c = st.columns([1.1, 2.6, 2.2, 2.6], vertical_alignment="bottom")
        on = c[0].toggle("Live data", key=ON, on_change=_follow_again,
                         help="Paint the diagram's boxes with a run's facts")
        keys = [s.key for s in found]
        if st.session_state.get(SOURCE) not in keys:
            st.session_state[SOURCE] = keys[0]
        labels = {s.key: s.label for s in found}
        c[1].selectbox("Run", keys, key=SOURCE, format_func=labels.get, disabled=len(keys) < 2,
                       on_change=_follow_again)
        source = next(s for s in found if s.key == st.session_state[SOURCE])
        if st.session_state.get(METRIC) not in METRICS:
            st.session_state[METRIC] = "load"
        c[2].selectbox("Metric", list(METRICS), key=METRIC, format_func=METRICS.get)
        names = {ALL: "all tokens"} | {t.pos: token_label(source.trace, t.pos) for t in source.trace.tokens(0)}
        if st.session_state.get(TOKEN) not in names:
            st.session_state[TOKEN] = ALL
        c[3].selectbox("Token", list(names), key=TOKEN, format_func=names.get,
                       help="Repaint for one token; prompt tokens are marked (prompt), generated ones (new)")
        _keep()
        _files()
        if not on:
            return None
        args, run_config = run_args(source.model)
        if notice := st.session_state.pop(NOTICE, None):
            st.info(notice, icon=":material/swap_horiz:")
        note = ""
        if args is not None and args != view.args:
            if st.session_state.get(FOLLOWED) != source.ident:   # a new run (or the overlay just turned on)
                st.session_state[FOLLOWED] = source.ident
                st.session_state[CHOICE] = run_config
                st.session_state[NOTICE] = (f"The diagram now shows {literal(run_config)}, the config of the run it "
                                            f"paints ({literal(source.model)}); it showed {literal(config_key)}.")
                st.rerun()
            st.warning(f"The run was made by {literal(source.model)}, whose config ({literal(run_config)}) is not the "
                       f"one drawn here: nothing is painted.", icon=":material/warning:")
            if st.button(f"Draw {run_config}", key="arch_overlay_follow", icon=":material/swap_horiz:"):
                st.session_state[CHOICE] = run_config
                st.rerun()
            return None
        st.session_state[FOLLOWED] = source.ident
        if args is None:
            note = (f"The run's model ({literal(source.model or 'unnamed')}) is not one this server knows: its values "
                    "are painted on the boxes of the drawn config with the same module paths.")
        pos = None if st.session_state[TOKEN] == ALL else int(st.session_state[TOKEN])
        painted = _overlay(source, st.session_state[METRIC], pos, args)
        return LiveOverlay(source, painted, pos, note)


def _follow_again() -> None:
    """Turned on, or another run picked: the diagram follows the run's config again."""
    st.session_state.pop(FOLLOWED, None)


def _overlay(source: Source, metric: str, pos: int | None, args) -> Overlay:
    memo = st.session_state.setdefault(MEMO, {})
    key = (source.ident, metric, pos)
    if key not in memo:
        if len(memo) > 64:
            memo.clear()
        memo[key] = overlay(source.trace, metric, pos, args)
    return memo[key]


def run_args(model: str) -> tuple[ModelArgs | None, str]:
    """The config of the model that made a run, and the sidebar config key that draws it (its preset, or that config
    registered as this session's upload); (None, '') for a model this server does not know."""
    choices = engine_session.model_choices()
    if model in choices:
        choice = choices[model]
        args = _config(str(choice.config))
        return args, diagram_config(model, choice.config, args)
    if model in list_presets():
        return args_for(model), model
    return None, ""


@lru_cache(maxsize=16)
def _config(path: str) -> ModelArgs:
    return load_config(path)


def _files() -> None:
    """The trace loader, drawn when its expander is opened (the first view carries no uploader)."""
    files = st.expander("Load a saved trace here", key="arch_overlay_files", on_change="rerun")
    if files.open:
        with files:
            _upload()


def _upload() -> None:
    """A saved trace (.json, .parquet.zip, .safetensors) through the Inspect page's bounded loader."""
    file = st.file_uploader("Trace file", type=["json", "zip", "safetensors"], key="arch_overlay_file",
                            help="Saved from the Inspect page or `python -m engine generate --trace FILE`")
    if file is None:
        return
    digest = hashlib.sha256(f"{file.name}:{file.size}:{getattr(file, 'file_id', '')}".encode()).hexdigest()
    held = st.session_state.get(UPLOADED)
    if held is None or held[0] != digest:
        try:
            held = (digest, file.name, trace_from_upload(file.name, file), "")
            st.session_state[PENDING] = {SOURCE: "upload", ON: True}   # the new trace paints at once
        except ValueError as e:   # TraceFormatError and the size limit: the message names the file and the problem
            held = (digest, file.name, None, load_failure(file.name, e))
        st.session_state[UPLOADED] = held
        if held[2] is not None:
            st.rerun()
    if held[3]:
        st.error(held[3], icon=":material/error:")


def paint(html: str, live: LiveOverlay) -> str:
    """The drawing painted with the overlay, and what the colours mean said above it."""
    o = live.overlay
    html, elsewhere = paint_svg(html, o.fills(), o.legend(), o.title)
    shown = sum(1 for n in o.cells if n not in elsewhere)
    hidden = f" {len(elsewhere)} more values belong to modules of other layers: click a layer in the stack to open " \
             "it in the detail column." if elsewhere and shown else ""
    if not o.cells:
        hidden = " No box of this diagram has a value for this metric."
    elif not shown:
        hidden = " None of the painted modules is drawn in this diagram."
    st.container(key="arch_overlay_note").caption(
        f":material/sensors: **{literal(o.title)}** — {o.note}{hidden} {live.note}".rstrip()
        + f" Source: {literal(live.source.label)}.")
    return html


def url_params(live: LiveOverlay | None) -> dict[str, str]:
    """The overlay's part of the page's URL: the metric and the token while it paints."""
    if live is None:
        return {}
    return {URL_METRIC: live.overlay.metric} | ({} if live.pos is None else {URL_TOKEN: str(live.pos)})


def open_in_inspect(live: LiveOverlay, node: str) -> None:
    """Hand the run to the Inspect page on the panel that shows `node`, filtered to it, at the overlay's token."""
    source = live.source
    serial = source.serial
    if source.key == "upload":
        from .inspect_page import show_trace  # imports the engine: only when the run is handed over
        serial = show_trace(source.trace, source.name).serial
    else:
        st.session_state[SHOWN_RUN] = source.key
    st.session_state[INSPECT_JUMP] = (source.model, node)
    if live.pos is not None:
        st.session_state[INSPECT_TOKEN], st.session_state[INSPECT_TOKEN_RUN] = live.pos, serial
    st.switch_page("pages/inspect.py", query_params={"node": node, "panel": panel_for(node) or "Experts"})
