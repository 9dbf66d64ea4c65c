"""The Inspect page's "What if…" section: pick changes inside the model for the selected token and layer, rerun the
same prompt, settings and seed through the engine's queue (streamed, with Stop), and see both runs side by side."""
from __future__ import annotations

import math
import time
from functools import partial

import streamlit as st

from engine.spec.errors import EngineError

from ..inspect import background
from ..inspect.export import trace_bytes
from ..inspect.run import LiveRun, status_sentence
from ..inspect.run_diff import RunDiff, diff_traces
from ..inspect.run_meta import describe_intervention, interventions_of, settings_line
from ..inspect.run_pair import new_run
from ..inspect.tokens import literal_text_html
from ..inspect.what_if import (
    EXPERT_KINDS,
    KIND_LABELS,
    LAYER_KINDS,
    PANEL_KIND,
    SCOPES,
    WhatIf,
    check_changes,
    chosen_experts,
    default_expert,
    default_layer,
    first_position,
    intervention_text,
    layer_label,
    logprob_changes,
    logprob_figure,
    looked_layer,
    offered_kinds,
    position_that_matters,
    rerun_settings,
    routing_by_layer,
    routing_changes,
)
from .inspect_page import settings_into_form
from .page_links import LIVE_RUN as LIVE
from .page_links import SHOWN_RUN as SHOWN
from .run_diff_view import output_html
from .run_diff_view import routing as routing_heatmap
from .static_table import show_table

STATE, KEPT, DIFF = "what_if", "what_if_kept", "what_if_diff"   # the last rerun; changes kept for the next; its diff
KIND, LAYER, EXPERT, STAGE, SCOPE = "what_if_kind", "what_if_layer", "what_if_expert", "what_if_stage", "what_if_scope"
STATUS_STOP = "[data-testid='stStatusWidget'] button"
POLL_S = 0.2
CHART = {"width": "stretch", "config": {"displayModeBar": False}}


def forget() -> None:
    """A new main run: the last what-if is over (a rerun still going is stopped)."""
    held = st.session_state.pop(STATE, None)
    if held is not None and held.run.active:
        background.stop(held.run)
    st.session_state.pop(KEPT, None)


def section(slot, run: LiveRun, view: dict[str, object], pos: int) -> None:
    """The section under the panels: the picker, then the rerun (live while it streams) beside the baseline."""
    st.divider()
    st.subheader("What if…")
    if run.model != slot.choice.key:
        st.info(f"This run is of {run.model or 'an unnamed model'}; pick that model to rerun it with a change.")
        return
    if run.active:
        st.caption("When the run has ended, change one thing inside the model here and run the same prompt again.")
        return
    st.caption("Change one thing inside the model (chosen for the token and layer selected above), run the same "
               "prompt, settings and seed again, and see what moved: the text, the probability of each baseline "
               "token, and the experts each layer chose.")
    changes = picker(slot.args, run, view, pos)
    if changes:
        start(slot, run, changes)
    held: WhatIf | None = st.session_state.get(STATE)
    if held is None or held.baseline is not run:
        return
    if held.run.active:
        watch(held)
    result(held)


def _default(key: str, context: tuple, value) -> None:
    """Set a widget's value when what it depends on changed, or when Streamlit dropped it (a widget not drawn in
    the last run loses its value); else the person's own choice stays."""
    if st.session_state.get(f"{key}_for") != context or key not in st.session_state:
        st.session_state[f"{key}_for"], st.session_state[key] = context, value


def picker(args, run: LiveRun, view: dict[str, object], pos: int) -> tuple[str, ...]:
    """The change being made, the changes kept beside it, and the buttons; the changes to run when pressed."""
    layer_seen, stage_seen = looked_layer(view)
    pos, why = position_that_matters(run.trace, pos)
    if why:
        st.container(key="what_if_position").info(why, icon=":material/info:")
    seen = (run.serial, pos, view.get("panel"), layer_seen, stage_seen)
    kinds = offered_kinds(bool(run.trace.dspark_steps))
    suggested = PANEL_KIND.get(str(view.get("panel")), "ban-expert")
    _default(KIND, seen, suggested if suggested in kinds else kinds[0])
    kept: list[str] = st.session_state.setdefault(KEPT, [])
    c = st.columns([2, 2, 2, 4])
    kind = c[0].selectbox("Change", kinds, key=KIND, format_func=KIND_LABELS.get)
    layer = expert = None
    if kind in LAYER_KINDS:
        _default(LAYER, (seen, kind), default_layer(args, kind, layer_seen))
        layer = c[1].selectbox("Layer", range(args.n_layers), key=LAYER, format_func=partial(layer_label, args))
    if kind == "drop-stage":
        stages = range(args.n_draft_stages)
        _default(STAGE, seen, stage_seen if stage_seen in stages else 0)
        layer = c[1].selectbox("Drafter stage", stages, key=STAGE, format_func=lambda s: f"stage {s} (mtp.{s})")
    if kind in EXPERT_KINDS:
        chosen = chosen_experts(run.trace, layer, pos)
        _default(EXPERT, (seen, kind, layer), default_expert(kind, chosen, args.n_routed_experts))
        expert = c[2].selectbox("Expert", range(args.n_routed_experts), key=EXPERT,
                                format_func=partial(expert_label, dict(chosen)),
                                help="chosen: an expert this token chose at this layer (its routing weight)")
    _default(SCOPE, seen, "onwards")
    scope = c[3].radio(f"Positions (the selected token is position {pos})", list(SCOPES), key=SCOPE,
                       format_func=SCOPES.get, horizontal=True)
    text = intervention_text(kind, layer, expert, pos, scope)
    for i, earlier in enumerate(kept):
        k = st.columns([8, 1])
        k[0].caption(f":material/add_task: Also applied: {describe_intervention(earlier)} (`{earlier}`)")
        k[1].button("Remove", key=f"what_if_drop_{i}", type="tertiary", on_click=kept.pop, args=(i,))
    try:
        checked = check_changes([*kept, text], args)
    except EngineError as e:     # the engine's own sentence: a layer without Engram, a hash-routed layer, ...
        st.container(key="what_if_problem").error(str(e), icon=":material/block:")
        checked = ()
    else:
        st.container(key="what_if_change").markdown(f"**{describe_intervention(checked[-1])}** · `{checked[-1]}`")
    b = st.columns([2, 2, 5])
    label = "Rerun with this change" if not kept else f"Rerun with these {len(kept) + 1} changes"
    go = b[0].button(label, key="what_if_rerun", type="primary", icon=":material/replay:", disabled=not checked)
    b[1].button("Keep it and add another", key="what_if_keep", icon=":material/add:", disabled=not checked,
                on_click=lambda: kept.append(checked[-1]) if checked and checked[-1] not in kept else None)
    return checked if go else ()


def expert_label(weights: dict[int, float], expert: int) -> str:
    return f"expert {expert}" + (f" · chosen ({weights[expert]:.2f})" if expert in weights else "")


def start(slot, run: LiveRun, changes: tuple[str, ...]) -> None:
    """The baseline's settings with the changes, through the same background runner, queue and Stop as a run."""
    settings = rerun_settings(run, changes)
    try:
        settings.check()
        check_changes(settings.interventions, slot.args)
    except EngineError as e:
        st.error(str(e))
        return
    forget()
    rerun = new_run(slot, settings)
    background.start(slot, settings, rerun)
    st.session_state[STATE] = WhatIf(run, rerun, changes)


def watch(held: WhatIf) -> None:
    """The rerun streaming, with its own Stop; the page is drawn again when it ends."""
    r = held.run
    st.html(f"<style>{STATUS_STOP} {{display: none}}</style>")
    st.button("Stop", key="what_if_stop", icon=":material/stop_circle:", on_click=background.stop, args=(r,),
              help="stops the rerun after the current token; the comparison shows what it made so far")
    status = st.empty()
    text = st.container(key="what_if_stream", border=True).empty()
    shown = -1
    while r.still_watched():
        sentence = status_sentence(r)
        status.caption(f":material/replay: Rerun with the change: {sentence} · {time.perf_counter() - r.started:.1f} s")
        if r.n_tokens != shown:
            shown = r.n_tokens
            text.html(literal_text_html(r.prompt, r.text))
        time.sleep(POLL_S)
    st.rerun()


def diff_of(held: WhatIf) -> RunDiff:
    key = tuple((id(r.trace), len(r.trace.tokens(0)), r.status) for r in (held.baseline, held.run))
    cached = st.session_state.get(DIFF)
    if cached is None or cached[0] != key:
        cached = (key, diff_traces(held.baseline.trace, held.run.trace))
        st.session_state[DIFF] = cached
    return cached[1]


def result(held: WhatIf) -> None:
    """The baseline (A) and the rerun (B): texts, the baseline tokens' log-probabilities, routing changes."""
    a, b = held.baseline, held.run
    st.container(key="what_if_applied").markdown(
        "**The change:** " + "; ".join(describe_intervention(t) for t in held.changes) +
        f" · rerun status: **{status_sentence(b)}**")
    st.container(key="what_if_settings").caption(settings_line(b.model, b.trace.meta))
    earlier = [t for t in interventions_of(a.trace.meta) if t not in held.changes]
    if earlier:
        st.caption("On top of the baseline's own changes: " + "; ".join(map(describe_intervention, earlier)) + ".")
    if b.message:
        st.error(b.message)
    if not b.trace.tokens(0):
        return
    diff = diff_of(held)
    t = diff.tokens
    start_pos = first_position(held.changes)
    lp = logprob_changes(a.trace, b.trace, t.shared_prefix)
    changed = routing_changes(diff, a.trace)
    c = st.columns(4)
    c[0].metric("new tokens that agree", f"{t.generated_agree} of {t.generated_compared}")
    c[1].metric("first divergence", "none" if t.first_divergence is None else f"position {t.first_divergence}")
    same_input = int(diff.routing['same input'].astype(bool).sum())
    c[2].metric("routing changes (same text)", f"{len(changed)} of {same_input}",
                help="(layer, token) pairs whose chosen experts differ, over the tokens both runs read identically")
    value, about = largest_change(lp)
    c[3].metric("largest log-prob change", value, help=about)
    cols = st.columns(2)
    for col, side, title, run in zip(cols, "AB", ("A · baseline", "B · with the change"), (a, b)):
        with col.container(border=True, key=f"what_if_output_{'baseline' if side == 'A' else 'rerun'}"):
            st.markdown(f"**{title}** · {run.n_tokens} new tokens")
            st.html(output_html(t, side))
    st.caption("Highlighted: a token that differs from the other run's at the same index; outlined: the first "
               "divergence. Hover a token for its position, id and the other run's token.")
    logprob(lp, a, start_pos, t.first_divergence)
    routing(diff, changed, start_pos)
    handover(held)


def largest_change(lp) -> tuple[str, str]:
    """The metric's value and help: the largest change in nats, or the bound at the divergence when that is
    larger (the baseline's token fell below the rerun's top-k: it lost at least that much)."""
    known, bounds = lp["change"].dropna(), lp["change at most"].dropna()
    worst = known.abs().idxmax() if len(known) else None
    bound = bounds.idxmin() if len(bounds) else None
    about = "nats, over the baseline tokens both runs predicted from the same text"
    if bound is not None and (worst is None or -lp.loc[bound, "change at most"] > abs(lp.loc[worst, "change"])):
        return (f"≤ {lp.loc[bound, 'change at most']:+.3f}",
                f"{about}; at position {int(lp.loc[bound, 'pos'])} the baseline's token fell below the rerun's "
                "top-k, so its log-probability dropped by at least this much")
    if worst is None:
        return "–", about
    return f"{lp.loc[worst, 'change']:+.3f}", f"{about}; at position {int(lp.loc[worst, 'pos'])}"


def logprob(lp, a: LiveRun, start_pos: int, divergence: int | None) -> None:
    st.markdown("**Log-probability of the baseline's tokens**")
    st.plotly_chart(logprob_figure(lp, a.trace, start_pos, divergence), key="what_if_logprob_chart", **CHART)
    st.caption("Each bar: log p(the baseline's token) in the rerun minus in the baseline, in nats, from the tokens "
               "the two traces recorded. While the texts agree both runs predicted that token from the same text. "
               "At the first divergence the text before still agrees, so the rerun's value comes from its recorded "
               "top-k; where the baseline's token fell below it, a grey bar is the most the change can be. After "
               "the divergence the runs read different text and nothing is compared (the table below says so).")
    with st.expander("Every position"):
        show_table(lp.round({"baseline log p": 4, "rerun log p": 4, "change": 4, "change at most": 4}),
                   scroll_height=400)


def routing(diff: RunDiff, changed, start_pos: int) -> None:
    st.markdown("**Routing changes** — the experts each layer chose for the same text")
    shared = diff.tokens.shared_prefix
    if changed.empty:
        sentence = "No layer chose other experts for any token both runs read identically"
    else:
        first = int(changed["pos"].min())
        sentence = (f"No expert choice changed before position {first}" +
                    (f" (the change applies from position {start_pos})" if start_pos != first else
                     " (the first position the change applies at)"))
    st.container(key="what_if_routing_summary").markdown(
        f"{sentence}; compared over positions 0–{shared - 1}, where both runs read the same text.")
    show_table(routing_by_layer(diff, changed))
    if not changed.empty:
        with st.container(key="what_if_routing_changes"):
            show_table(changed.astype({"baseline experts": str, "rerun experts": str, "dropped": str, "added": str}),
                       scroll_height=420)
    routing_heatmap(diff, key="what_if_routing_chart")
    if not math.isnan(diff.routing_agreement_all):
        st.caption(f"Mean Jaccard overlap of the chosen experts over every token both runs recorded: "
                   f"{diff.routing_agreement_all:.2f} (1 = the same experts everywhere).")


def handover(held: WhatIf) -> None:
    """The rerun opened as the page's main run, or downloaded as a trace."""
    c = st.columns([2, 2, 4])
    c[0].button("Open the rerun as the main run", key="what_if_open", icon=":material/open_in_full:",
                on_click=open_as_main, args=(held,), help="the panels above show the rerun; the baseline is replaced")
    c[1].download_button("Download the rerun's trace", partial(trace_bytes, held.run.trace, "json"),
                         file_name="trace_what_if.json", mime="application/json", key="what_if_download",
                         icon=":material/download:", on_click="ignore")


def open_as_main(held: WhatIf) -> None:
    st.session_state[LIVE], st.session_state[SHOWN] = held.run, "live"
    settings_into_form(held.run.trace.meta)
    st.session_state.pop(STATE, None)
    st.session_state.pop(KEPT, None)
