"""The live generation on the Inspect page: start it in the background, watch it stream (the page may be left
and come back: the run goes on), and Stop it."""
from __future__ import annotations

import time

import streamlit as st

from engine.spec.errors import EngineError

from ..inspect import background
from ..inspect.run import GenSettings, LiveRun, new_trace, status_sentence
from ..inspect.run_store import RunStore
from ..inspect.tokens import literal_text_html
from . import engine_session
from .page_links import LIVE_RUN as LIVE
from .page_links import SHOWN_RUN as SHOWN

STATUS_STOP = "[data-testid='stStatusWidget'] button"
POLL_S = 0.2


def start(slot: engine_session.EngineSlot, settings: GenSettings) -> bool:
    """Check the settings and start the generation in the background (a running one of this session is stopped
    first: one live run per session). False, with the message on the page, when the settings are refused."""
    try:
        settings.check()
    except EngineError as e:
        st.error(str(e))
        return False
    previous = st.session_state.get(LIVE)
    if previous is not None and previous.active:
        background.stop(previous)
    weights = engine_session.shown_source(slot.engine.source)   # no server path in the trace a user downloads
    run = LiveRun(new_trace(settings, slot.choice.key, weights, slot.args), slot.choice.key, prompt=settings.prompt)
    st.session_state[LIVE], st.session_state[SHOWN] = run, "live"
    background.start(slot, settings, run, inspect_page_store())
    return True


@st.cache_resource(show_spinner=False)
def inspect_page_store() -> RunStore:
    """The server's run store (one per process): every Inspect run is kept there, so a link opens it again."""
    return RunStore()


def watch(model: str) -> None:
    """While this session's live run of `model` is generating: its status, progress and text, refreshed until it
    ends, then the page is drawn again with the finished run. Leaving the page only stops the watching."""
    run: LiveRun | None = st.session_state.get(LIVE)
    if run is None or run.model != model or not run.active:
        return
    # One Stop: Streamlit's own top-bar Stop would end this watching, not the generation; the page's Stop ends it.
    st.html(f"<style>{STATUS_STOP} {{display: none}}</style>")
    st.button("Stop", key="inspect_stop", icon=":material/stop_circle:", on_click=_stop_here, args=(run,),
              help="stops after the current token; the panels show what was generated so far")
    status, progress = st.empty(), st.empty()
    text = st.container(key="inspect_stream", border=True).empty()
    shown_tokens = -1
    while run.still_watched():
        waited = time.perf_counter() - run.started
        sentence = status_sentence(run)
        status.caption(f":material/sensors: {sentence[:1].upper()}{sentence[1:]} · {waited:.1f} s since Generate")
        progress.progress(*_progress(run))
        if run.n_tokens != shown_tokens:
            shown_tokens = run.n_tokens
            text.html(literal_text_html(run.prompt, run.text))
        time.sleep(POLL_S)
    st.rerun()


def _stop_here(run: LiveRun) -> None:
    """The page's Stop: end the run after its current step. The user saw it end on this page; the rerun that the
    click starts cuts the watching loop short before it notes the end, which would otherwise read as a run that
    finished while the user was on another page."""
    background.stop(run)
    if not run.active:
        run.end_seen = True


def _progress(run: LiveRun) -> tuple[float, str]:
    if run.phase == "queued":
        return 0.0, (f"Waiting for the engine: {run.ahead} generation(s) from other sessions ahead of this one "
                     "(one generation at a time keeps every session's output exactly what it would be alone).")
    if run.phase == "schedule":
        return 0.0, "Reading this machine's throughput table for the auto DSpark schedule (profiled once if missing)."
    if run.phase == "profiling":
        done, total = run.profiled
        return (done / total if total else 0.0), (
            f"Profiling this machine for the auto DSpark schedule: {done}/{total} verify shapes timed. This "
            "happens once per machine and model (the table is stored and reused); the first token follows.")
    if run.phase == "prefill":
        return 0.0, "Reading the prompt (prefill); the first token follows."
    rate = run.tokens_per_s
    first = "" if run.first_token_s is None else f" · first token after {run.first_token_s:.2f} s"
    return (min(run.n_tokens / max(run.max_new_tokens, 1), 1.0),
            f"{run.n_tokens}/{run.max_new_tokens} tokens · {'–' if rate != rate else f'{rate:.1f}'} tokens/s{first}")
