"""The Compare page's Runs part: one prompt through two models (one after the other, through the engine slots the
Inspect page uses), or two saved traces; then the two runs side by side. Torch is imported only once a run starts."""
from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from engine.spec.errors import EngineError

from ..inspect.export import trace_from_upload
from ..inspect.tokens import literal_text_html
from . import engine_session, kept
from .plain_text import literal, load_failure
from .run_diff_view import Side, show_diff

SOURCE, RUN, UPLOAD = "compare_runs_source", "Run two models", "Compare two saved traces"
PAIR = "compare_runs_pair"
MODEL_A, MODEL_B = "compare_runs_a", "compare_runs_b"
UPLOADED = "compare_runs_uploaded"       # {"A"/"B": (digest, name, trace or None, error)}
GO, SEEDED = "compare_runs_go_settings", "compare_runs_seeded"   # Run both pressed; the link read once
# widget key → URL parameter; the number inputs' bounds
URL = {MODEL_A: "ra", MODEL_B: "rb", "compare_runs_prompt": "rprompt", "compare_runs_max_new": "rmax",
       "compare_runs_temperature": "rtemp", "compare_runs_seed": "rseed", "compare_runs_dspark": "rdspark"}
BOUNDS = {"compare_runs_max_new": (int, 1, 512), "compare_runs_temperature": (float, 0.0, 5.0),
          "compare_runs_seed": (int, 0, 2**31 - 1)}
PROMPT_INLINE = 1000   # characters of the prompt the URL carries
FORM_DEFAULTS = {"compare_runs_prompt": "ROMEO:", "compare_runs_max_new": 16, "compare_runs_temperature": 0.0,
                 "compare_runs_seed": 0, "compare_runs_dspark": False}
STATUS_STOP = "[data-testid='stStatusWidget'] button"   # Streamlit's own Stop would end the watching, not the runs
POLL_S = 0.2


def runs_part() -> None:
    st.caption("Run one prompt through two models, or load two saved traces, and see where the runs differ: the "
               "tokens, the experts each layer chose for the same input, Engram gates, mHC gains and DSpark "
               "acceptance. Every figure here is live data from the two runs (or the loaded traces).")
    source = st.segmented_control("Compare", [RUN, UPLOAD], key=SOURCE, default=RUN, required=True,
                                  label_visibility="collapsed")
    if source == UPLOAD:
        uploaded_pair()
        return
    choices = engine_session.model_choices()
    submitted = run_form(choices)
    if submitted is not None:
        start(choices, *submitted)
    pair = st.session_state.get(PAIR)
    if pair is None:
        st.info("Pick two models and press **Run both**: A runs first, then B, each as the Inspect page would run it.")
        return
    if pair.active:
        watch(pair)
    ended(pair)
    show_diff(Side("A", pair.a.trace, pair.a.model), Side("B", pair.b.trace, pair.b.model))


def _default_pair(choices: dict[str, engine_session.ModelChoice]) -> tuple[str, str]:
    """A V4 preset and a V4.1 one of the same size (both run on a CPU in seconds), when this server offers them."""
    keys = list(choices)
    return ("tiny-v4" if "tiny-v4" in keys else keys[0],
            "tiny-v4.1" if "tiny-v4.1" in keys else engine_session.default_model(choices))


def run_form(choices: dict[str, engine_session.ModelChoice]):
    """The two models and one set of settings; (key A, key B, settings fields) when Run both is pressed. The widgets
    are a fragment, not an st.form (which sends its values only on submit): an edit not yet run survives a visit to
    another page (kept.py), and the form is in the URL (r* parameters)."""
    keys = list(choices)
    default_a, default_b = _default_pair(choices)
    linked = {}
    if SEEDED not in st.session_state:
        st.session_state[SEEDED] = True
        linked = form_from_query(st.query_params.to_dict(), keys)
    for key in (MODEL_A, MODEL_B):   # a kept model this server no longer offers falls back to the default
        if st.session_state.get(key, kept.value(key, default_a)) not in keys:
            st.session_state[key] = default_a if key == MODEL_A else default_b
    kept.restore(FORM_DEFAULTS | {MODEL_A: default_a, MODEL_B: default_b}, linked)
    _form(choices)
    want = {URL[k]: _text(v) for k, v in ((k, st.session_state[k]) for k in URL)}
    if any(st.query_params.get(name) != value for name, value in want.items()):
        st.query_params.update(want)
    model_a, model_b = st.session_state[MODEL_A], st.session_state[MODEL_B]
    pair = st.session_state.get(PAIR)
    if pair is None or (pair.a.model, pair.b.model) != (model_a, model_b):   # else the results below say it
        random = [f"{side} ({literal(key)})" for side, key in (("A", model_a), ("B", model_b))
                  if choices[key].checkpoint is None and not choices[key].service]
        if random:
            st.caption(f":material/casino: {' and '.join(random)} {'has' if len(random) == 1 else 'have'} random "
                       "weights: the text is noise; routing, gates and drafts are the real machinery on random "
                       "parameters.")
    return st.session_state.pop(GO, None)


@st.fragment
def _form(choices: dict[str, engine_session.ModelChoice]) -> None:
    """The form's widgets: an edit reruns only this part; Run both reruns the page with GO set."""
    keys = list(choices)
    with st.container(border=True, key="compare_runs_form"):
        c = st.columns(2)
        model_a = c[0].selectbox("Model A", keys, **kept.widget(MODEL_A), format_func=lambda k: choices[k].label)
        model_b = c[1].selectbox("Model B", keys, **kept.widget(MODEL_B), format_func=lambda k: choices[k].label)
        prompt = st.text_area("Prompt", **kept.widget("compare_runs_prompt"), height=80)
        d = st.columns(4)
        max_new = d[0].number_input("max new tokens", 1, 512, **kept.widget("compare_runs_max_new"))
        temperature = d[1].number_input("temperature", 0.0, 5.0, step=0.1, **kept.widget("compare_runs_temperature"),
                                        help="0 = greedy; above 0 both runs sample with the same seed")
        seed = d[2].number_input("seed", 0, 2**31 - 1, **kept.widget("compare_runs_seed"))
        dspark = d[3].toggle("DSpark", **kept.widget("compare_runs_dspark"),
                             help="speculative decoding with each model's drafter (a model without one runs plainly)")
        go = st.button("Run both", key="compare_runs_go", type="primary", icon=":material/play_arrow:")
    kept.remember()
    if go:
        st.session_state[GO] = (model_a, model_b, {"prompt": prompt, "max_new_tokens": int(max_new),
                                                   "temperature": float(temperature), "seed": int(seed),
                                                   "dspark": bool(dspark), "attention": True})   # every panel
        st.rerun()   # the whole page: it starts the runs


def form_from_query(params: dict[str, str], keys: list[str]) -> dict[str, object]:
    """The form's values a link carries (r* parameters); a value out of the form's bounds is left out."""
    out: dict[str, object] = {}
    for widget, name in URL.items():
        text = params.get(name)
        if text is None:
            continue
        if widget in (MODEL_A, MODEL_B):
            if text in keys:
                out[widget] = text
        elif widget == "compare_runs_prompt":
            if 0 < len(text) <= PROMPT_INLINE:
                out[widget] = text
        elif widget == "compare_runs_dspark":
            if text in ("0", "1"):
                out[widget] = text == "1"
        else:
            kind, low, high = BOUNDS[widget]
            try:
                value = kind(text)
            except ValueError:
                continue
            if low <= value <= high:
                out[widget] = value
    return out


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return format(value, "g")
    return str(value)[:PROMPT_INLINE]


def start(choices, key_a: str, key_b: str, fields: dict) -> None:
    """Check the settings, load both engines (cached for the process, shared with Inspect) and start A then B."""
    # inspect.run loads torch: the Compare page stays torch-free until a run starts
    from ..inspect.run import GenSettings
    from ..inspect.run_pair import start_pair
    settings = GenSettings(**fields)
    try:
        settings.check()
    except EngineError as e:
        st.error(str(e))
        return
    previous = st.session_state.get(PAIR)
    if previous is not None and previous.active:
        previous.stop()
    slot_a, slot_b = engine_session.engine_slot(choices[key_a]), engine_session.engine_slot(choices[key_b])
    settings_a, settings_b = (replace(settings, dspark=settings.dspark and bool(s.args.has_dspark))
                              for s in (slot_a, slot_b))
    st.session_state[PAIR] = start_pair(slot_a, settings_a, slot_b, settings_b)


def watch(pair) -> None:
    """Both runs' status and text while they generate (A, then B), with one Stop for the pair; the page is drawn
    again when both have ended. Leaving the page only stops the watching."""
    # inspect.run loads torch: the Compare page stays torch-free until a run starts
    from ..inspect.run import status_sentence
    st.html(f"<style>{STATUS_STOP} {{display: none}}</style>")
    st.button("Stop", key="compare_runs_stop", icon=":material/stop_circle:", on_click=pair.stop,
              help="stops the run that is generating; B does not start when A is stopped")
    cols = st.columns(2)
    boxes = [(c.empty(), c.container(border=True, key=f"compare_stream_{side.lower()}").empty())
             for c, side in zip(cols, "AB")]
    shown = [-1, -1]
    while pair.active:
        for i, (run, (status, text)) in enumerate(zip(pair.runs, boxes)):
            waiting = run.thread is None and run.status == "running"
            sentence = "waits for A to finish" if waiting else status_sentence(run)
            status.caption(f"**{'AB'[i]}** · {literal(run.model)} · {sentence}")
            if run.n_tokens != shown[i]:
                shown[i] = run.n_tokens
                text.html(literal_text_html(run.prompt, run.text))
        time.sleep(POLL_S)
    st.rerun()


def ended(pair) -> None:
    """How each run ended, with its time, and any error message."""
    # inspect.run loads torch: the Compare page stays torch-free until a run starts
    from ..inspect.run import status_sentence
    cols = st.columns(2)
    for col, side, run in zip(cols, "AB", pair.runs):
        col.caption(f"**{side}** · {literal(run.model)} · {status_sentence(run)} · {run.elapsed_s:.2f} s")
        if run.message:
            col.error(run.message)


def uploaded_pair() -> None:
    """Two trace files (the Inspect page's loader and its size limits), then the same comparison."""
    st.caption("Traces saved from the Inspect page (or `python -m engine generate --trace FILE`): JSON, Parquet zip "
               "or safetensors.")
    held = st.session_state.setdefault(UPLOADED, {})
    cols = st.columns(2)
    for col, side in zip(cols, "AB"):
        file = col.file_uploader(f"Trace {side}", type=["json", "zip", "safetensors"],
                                 key=f"compare_upload_{side.lower()}")
        if file is None:
            held.pop(side, None)
            continue
        digest = (file.name, file.size, getattr(file, "file_id", ""))
        if held.get(side, (None,))[0] != digest:
            try:
                held[side] = (digest, file.name, trace_from_upload(file.name, file), "")
            except ValueError as e:   # TraceFormatError and the size limit: the message names the file
                held[side] = (digest, file.name, None, load_failure(file.name, e))
        if message := held[side][3]:
            col.error(message, icon=":material/error:")
    loaded = {side: held[side] for side in "AB" if side in held and held[side][2] is not None}
    if len(loaded) < 2:
        st.info("Load a trace on each side to compare them.")
        return
    show_diff(*(Side(side, loaded[side][2], str(loaded[side][2].meta.get("config", "")), loaded[side][1])
                for side in "AB"))
