"""Streamlit pieces of the Inspect page: model picker, prompt and settings, replay upload, the run's summary."""
from __future__ import annotations

import streamlit as st

from engine.request.decoding import SUGGESTED_NO_REPEAT_NGRAM, SUGGESTED_REPETITION_PENALTY
from engine.request.schedules import SCHEDULES
from engine.spec.errors import InputError

from ..inspect.export import trace_from_upload
from ..inspect.run import GenSettings, LiveRun, status_sentence
from ..inspect.run_meta import settings_line, settings_of
from ..inspect.tokens import literal_text_html, whitespace_note
from . import engine_session, kept
from .inspect_stream import LIVE, SHOWN, inspect_page_store
from .page_links import INSPECT_JUMP
from .page_links import LOADED_RUN as LOADED
from .plain_text import load_failure

MODEL, MODEL_KEPT = "inspect_model", "inspect_model_kept"
SERVICE_GONE = "inspect_service_gone"   # the notice that the attached engine service ended
EXPERTS, EXPERTS_KEPT = "inspect_experts", "inspect_experts_kept"
EXPERT_PLACES = {"device": "device", "host": "host memory"}   # Engine.load's experts → the sidebar's words
EXPERTS_HELP = ("Where the routed experts live. host memory: they stay in host RAM and run on the CPU for the tokens "
                "routed to them, while attention, the shared expert, the router, the head and the drafter's other "
                "parts stay on the device (`--experts host`: one GPU + host RAM). This app runs on the CPU, where "
                "both hold the same memory and generate the same text; the choice loads the model anew.")
UPLOAD_ERROR = "inspect_upload_error"
STORED_OPENED = "inspect_stored_opened"   # the run-store id a link named, once opened
STORED_ERROR = "inspect_stored_error"     # why it could not be opened
RANDOM_NOTE = "random weights: the text is noise; the machinery is real"


def model_sidebar(wanted: str = "") -> engine_session.ModelChoice:
    """Sidebar setting: which model the Inspect page runs (trained checkpoints appear when they land); wanted:
    the model a link names, for the session's first draw."""
    choices = engine_session.model_choices()
    kept = st.session_state.get(MODEL_KEPT)
    if kept is not None and (why := engine_session.service_gone(kept)):   # the service ended: run a local model
        st.session_state[MODEL_KEPT] = engine_session.default_model(choices)
        local = choices[st.session_state[MODEL_KEPT]].label
        st.session_state[SERVICE_GONE] = (f"The engine service is gone ({why}); this page runs {local} in this "
                                          "process instead.")
    if notice := st.session_state.get(SERVICE_GONE):   # said until another model is picked
        st.warning(notice, icon=":material/link_off:")
    jump = st.session_state.get(INSPECT_JUMP)
    if jump and jump[0] in choices:  # a diagram box of a runnable config: inspect that model
        st.session_state[MODEL_KEPT] = jump[0]
    if MODEL_KEPT not in st.session_state:
        st.session_state[MODEL_KEPT] = wanted if wanted in choices else engine_session.default_model(choices)
        if wanted and wanted not in choices:
            why = engine_session.why_not_offered(wanted)
            st.warning(f"The link asks for model '{wanted}', which this server cannot run"
                       + (f" ({why})" if why else "") + f"; showing {st.session_state[MODEL_KEPT]}.")
    st.session_state[MODEL] = st.session_state[MODEL_KEPT]
    with st.sidebar:
        st.markdown("### Inspect model")
        st.selectbox("Model to run", list(choices), key=MODEL, format_func=lambda k: choices[k].label,
                     on_change=_keep_model)
        st.caption("Presets of the V4.1 and V4 families small enough for this machine, and every `checkpoints/*/` "
                   f"directory. The engine runs on CPU with torch threads = {engine_session.TORCH_THREADS}.")
        choice = choices[st.session_state[MODEL_KEPT]]
        st.session_state[EXPERTS] = st.session_state.setdefault(EXPERTS_KEPT, "device")
        st.radio("Routed experts", list(EXPERT_PLACES), key=EXPERTS, format_func=EXPERT_PLACES.get, horizontal=True,
                 disabled=bool(choice.service), help=EXPERTS_HELP,
                 on_change=lambda: st.session_state.update({EXPERTS_KEPT: st.session_state[EXPERTS]}))
    return choice


def _keep_model() -> None:
    st.session_state[MODEL_KEPT] = st.session_state[MODEL]
    st.session_state.pop(SERVICE_GONE, None)


def experts_setting() -> str:
    """The sidebar's expert placement (Engine.load's experts), kept across pages."""
    return st.session_state.get(EXPERTS_KEPT, "device")


def weights_note(slot: engine_session.EngineSlot) -> None:
    a = slot.args
    source = engine_session.shown_source(slot.engine.source)   # not the server's absolute checkpoint path
    line = (f"**{slot.choice.key}** · {a.n_layers} layers + {a.n_draft_stages} draft stages · "
            f"{a.n_routed_experts} experts (top-{a.n_activated_experts}) · {source} · "
            f"loaded in {slot.load_s:.1f} s" + (" · routed experts in host memory" if slot.experts == "host" else ""))
    st.markdown(line)
    if slot.choice.service:
        st.caption(f"Runs in an engine service of {getattr(slot.engine, 'ranks', 1)} torch.distributed rank(s); "
                   "rank 0 streams the tokens and gathers the trace.")
    elif slot.choice.checkpoint is None:
        trained = "the trained `default` checkpoint" if (engine_session.CHECKPOINTS / "default").is_dir() else \
            "a trained checkpoint (none is installed under `checkpoints/`)"
        st.warning(f"This model has {RANDOM_NOTE}. For meaningful experts, gates and drafts pick {trained}.",
                   icon=":material/casino:")
    elif (card := engine_session.card_summary(slot.choice.checkpoint)) is not None:
        st.caption(card)


# The form's widgets and their defaults. Streamlit drops a widget's state on a page that does not draw it, so the
# values are also kept (kept.py) and put back when the page is drawn again. The widgets are not an st.form: a form
# sends its values only on submit, so a prompt typed but not yet generated would be lost on leaving the page; they
# live in a fragment instead, which reruns alone on each edit.
FORM_DEFAULTS = {"inspect_prompt": "ROMEO:", "inspect_max_new": 24, "inspect_temperature": 0.0, "inspect_top_p": 1.0,
                 "inspect_top_k": 0, "inspect_seed": 0, "inspect_attention": True, "inspect_dspark": False,
                 "inspect_schedule": "all", "inspect_threshold": 0.5,
                 "inspect_repetition_penalty": SUGGESTED_REPETITION_PENALTY,
                 "inspect_no_repeat_ngram": SUGGESTED_NO_REPEAT_NGRAM}
PENDING, LINKED, GO = "inspect_pending_settings", "inspect_link_seeded", "inspect_go"
SETTING_KEYS = {"prompt": "inspect_prompt", "max_new_tokens": "inspect_max_new", "temperature": "inspect_temperature",
                "top_p": "inspect_top_p", "top_k": "inspect_top_k", "seed": "inspect_seed",
                "attention": "inspect_attention", "dspark": "inspect_dspark", "schedule": "inspect_schedule",
                "threshold": "inspect_threshold", "repetition_penalty": "inspect_repetition_penalty",
                "no_repeat_ngram": "inspect_no_repeat_ngram"}
DECODING_NOTE = (f"On by default here: repetition penalty {SUGGESTED_REPETITION_PENALTY:g}, no-repeat n-gram "
                 f"{SUGGESTED_NO_REPEAT_NGRAM} (0 = off), measured on the shipped model to keep greedy text from "
                 "collapsing into runs of spaces or one repeated line. `python -m engine generate` leaves both off "
                 "(1 and 0) unless given `--repetition-penalty` / `--no-repeat-ngram`; "
                 "DSpark stays lossless under them.")


def restore_settings(linked: dict[str, object] | None = None) -> None:
    """Put the form's last values (or its defaults) into the widgets' keys before they are drawn; settings a
    replayed trace recorded take their place, and on the session's first draw those of a link (GenSettings
    field names)."""
    if LINKED not in st.session_state:
        st.session_state[LINKED] = True
        if linked:
            st.session_state.setdefault(PENDING, {}).update({SETTING_KEYS[k]: v for k, v in linked.items()})
    kept.restore(FORM_DEFAULTS, st.session_state.pop(PENDING, None))


def settings_form(args, linked: dict[str, object] | None = None) -> GenSettings | None:
    """The prompt and sampling settings; returns the settings when Generate is pressed."""
    restore_settings(linked)
    _form(bool(args.has_dspark))
    return st.session_state.pop(GO, None)


@st.fragment
def _form(can_draft: bool) -> None:
    """The form's widgets: an edit reruns only this part (and is kept); Generate reruns the page with GO set."""
    with st.container(border=True, key="inspect_form"):
        prompt = st.text_area("Prompt", **kept.widget("inspect_prompt"), height=90)
        c = st.columns(6)
        max_new = c[0].number_input("max new tokens", 1, 512, **kept.widget("inspect_max_new"))
        temperature = c[1].number_input("temperature", 0.0, 5.0, step=0.1, **kept.widget("inspect_temperature"),
                                        help="0 = greedy")
        top_p = c[2].number_input("top-p", 0.01, 1.0, step=0.05, **kept.widget("inspect_top_p"))
        top_k = c[3].number_input("top-k", 0, 1000, **kept.widget("inspect_top_k"), help="0 = off")
        seed = c[4].number_input("seed", 0, 2**31 - 1, **kept.widget("inspect_seed"))
        attention = c[5].toggle("trace attention", **kept.widget("inspect_attention"),
                                help="record the window/compressed split and the indexer's picks (slower)")
        d = st.columns([1, 2, 1])
        dspark = d[0].toggle("DSpark", **kept.widget("inspect_dspark"), disabled=not can_draft,
                             help="speculative decoding with the model's drafter" if can_draft
                             else "this model has no DSpark drafter")
        schedule = d[1].selectbox("DSpark schedule", list(SCHEDULES), **kept.widget("inspect_schedule"),
                                  format_func=lambda s: f"{s} — {SCHEDULES[s]}", disabled=not can_draft)
        threshold = d[2].slider("threshold", 0.0, 1.0, step=0.05, **kept.widget("inspect_threshold"),
                                disabled=not can_draft)
        r = st.columns([1, 1, 3])
        penalty = r[0].number_input("repetition penalty", 0.1, 10.0, step=0.05,
                                    **kept.widget("inspect_repetition_penalty"),
                                    help="the logit of every token already in the text is divided by it (when "
                                         "positive) or multiplied (when negative); 1 = off")
        no_repeat = r[1].number_input("no-repeat n-gram", 0, 10, **kept.widget("inspect_no_repeat_ngram"),
                                      help="never emit a token that would repeat an n-gram of the text; 0 = off")
        r[2].caption(DECODING_NOTE)
        go = st.button("Generate", key="inspect_generate", type="primary", icon=":material/play_arrow:")
    kept.remember()
    if go:
        st.session_state[GO] = GenSettings(prompt, int(max_new), float(temperature), float(top_p), int(top_k),
                                           int(seed), bool(dspark) and can_draft, schedule, float(threshold),
                                           bool(attention), repetition_penalty=float(penalty),
                                           no_repeat_ngram=int(no_repeat))
        st.rerun()   # the whole page: it starts the run


def replay_upload() -> None:
    """Upload a saved trace (.json, .parquet.zip, .safetensors) to show it in the same panels."""
    file = st.file_uploader("Replay a saved trace", type=["json", "zip", "safetensors"], key="inspect_upload")
    if file is None:
        st.session_state.pop(UPLOAD_ERROR, None)
        return
    digest = (file.name, file.size, getattr(file, "file_id", ""))
    if st.session_state.get("inspect_upload_seen") == digest:
        return
    st.session_state["inspect_upload_seen"] = digest
    try:
        trace = trace_from_upload(file.name, file)
    except ValueError as e:  # TraceFormatError and the size limit: the message names the file and the problem
        st.session_state[UPLOAD_ERROR] = load_failure(file.name, e)
        return
    st.session_state.pop(UPLOAD_ERROR, None)
    show_trace(trace, file.name)
    st.rerun()  # the form and the model picker above show the trace's settings


def show_trace(trace, name: str) -> LiveRun:
    """Make a trace the run the Inspect page shows (an upload here, or a run the Compare page hands over): its
    settings go into the form, and its model is picked when this server runs it."""
    run = loaded_run(trace, name)
    st.session_state[LOADED], st.session_state[SHOWN] = run, "loaded"
    settings_into_form(trace.meta)
    if run.model in engine_session.model_choices():
        st.session_state[MODEL_KEPT] = run.model  # the model that made it, so its panels draw against it
    return run


def open_stored_run(run_id: str) -> bool:
    """The run a link names by its run-store id, opened once per session (a refresh, a restarted server or a
    shared link on this server shows the run itself); a note when the store no longer has it. True when opened."""
    if not run_id or st.session_state.get(STORED_OPENED) == run_id:
        return False
    st.session_state[STORED_OPENED] = run_id
    try:
        trace, _ = inspect_page_store().open(run_id)
    except InputError as e:
        st.session_state[STORED_ERROR] = f"The link's stored run could not be opened: {e}."
        return False
    show_trace(trace, f"stored run {run_id}").store_id = run_id
    return True


def store_caption() -> None:
    """How much the run store holds, and where."""
    store = inspect_page_store()
    runs = store.runs()
    st.caption(f"Runs are kept on this server for their links: {len(runs)} stored, "
               f"{sum(r.bytes for r in runs) / 2**20:,.1f} MiB of at most {store.max_bytes / 2**20:,.0f} MiB "
               f"({store.max_runs} runs; the least recently used go first), in `{store.root}`.")


def settings_into_form(meta: dict) -> None:
    """The settings a trace recorded go into the form on the page's next draw."""
    recorded = settings_of(meta)
    if recorded.get("schedule") not in SCHEDULES:
        recorded.pop("schedule", None)
    st.session_state[PENDING] = {SETTING_KEYS[name]: value for name, value in recorded.items()}


def loaded_run(trace, name: str) -> LiveRun:
    """A replayed trace as a run: its text, token count and how it ended, from the trace alone."""
    toks = [t for r in trace.rows() for t in trace.tokens(r)]
    ended = str(trace.meta.get("finish", ""))
    status = {"stopped": "stopped", "interrupted": "stopped", "running": "running"}.get(ended, "done")
    run = LiveRun(trace, str(trace.meta.get("config", "")), source=f"loaded: {name}",
                  prompt=str(trace.meta.get("prompt", "")), status=status,
                  text="".join(t.text for t in toks if t.generated), n_tokens=sum(t.generated for t in toks),
                  finish=ended if ended in ("length", "stop", "max_seq_len") else "")
    run.stopped_by = "you" if ended == "stopped" else ""
    return run


def upload_error() -> None:
    """A rejected trace (or a stored run a link named that cannot be opened), said in the main area under the
    uploader (the page and any shown run stay)."""
    for key in (STORED_ERROR, UPLOAD_ERROR):
        if message := st.session_state.get(key):
            st.error(message, icon=":material/error:")


def current_run(model: str) -> LiveRun | None:
    """The run the panels show: the live one or the loaded trace (a switch appears when both exist). A run
    belongs to the model that made it: another model's run is kept for when that model is picked again, but
    never decoded or drawn against this one."""
    live, loaded = st.session_state.get(LIVE), st.session_state.get(LOADED)
    runnable = engine_session.model_choices()  # a trace of a model this server cannot run is shown as it is
    others = [r for r in (live, loaded) if r is not None and r.model and r.model != model
              and (r.source == "live" or r.model in runnable)]
    for r in others:
        kind = "live run" if r.source == "live" else r.source
        going = " and still generating" if r.active else ""
        st.caption(f":material/history: The previous {kind} is a run of {r.model} ({r.n_tokens} tokens{going}), "
                   f"kept for when that model is picked again; it is not shown against {model}.")
    live, loaded = (None if any(r is o for o in others) else r for r in (live, loaded))
    if live is not None and loaded is not None:
        st.segmented_control("Show", ["live", "loaded"], key=SHOWN, required=True,
                             format_func=lambda k: f"live run ({live.n_tokens} tokens)" if k == "live"
                             else loaded.source)
    shown = st.session_state.get(SHOWN, "live")
    return (loaded if shown == "loaded" else live) or live or loaded


def run_summary(run: LiveRun) -> None:
    badge = ":material/sensors: live" if run.source == "live" else f":material/folder_open: {run.source}"
    away = " · it finished in the background while you were on another page" if run.finished_unwatched else ""
    st.container(key="inspect_status").markdown(f"{badge} · status: **{status_sentence(run)}**{away}")
    if run.message:
        st.error(run.message)
    if (bad := run.prompt.find("\ufffd")) >= 0:
        st.warning(f"Character {bad + 1} of the prompt is U+FFFD, the replacement character: the text held something "
                   "that is not valid Unicode (such as a lone surrogate or a broken byte), which was replaced before "
                   "the model saw it. Retype that character if it was meant to be something else.",
                   icon=":material/warning:")
    st.container(key="inspect_run_settings").caption(settings_line(run.model, run.trace.meta))
    with st.container(key="inspect_output", border=True):
        st.html(literal_text_html(run.prompt, run.text))
        st.caption(whitespace_note(run.text))
    if run.source == "live":
        c = st.columns(4)
        c[0].metric("new tokens", run.n_tokens)
        c[1].metric("tokens/s after the first", _rate(run).removesuffix(" tokens/s"))
        c[2].metric("click → first token", "–" if run.first_token_s is None else f"{run.first_token_s:.2f} s")
        c[3].metric("total", f"{run.elapsed_s:.2f} s")
        if run.profile_s and run.first_token_s is not None:
            st.caption(f"The first token came after {run.first_token_s:.1f} s, "
                       f"of which {run.profile_s:.1f} s profiling "
                       "this machine for the auto schedule (done once; later runs reuse the stored table).")


def _rate(run: LiveRun) -> str:
    rate = run.tokens_per_s
    return "–" if rate != rate else f"{rate:.1f} tokens/s"

