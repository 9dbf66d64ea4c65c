"""Two runs side by side on the Compare page: the outputs with divergences marked, agreement figures, the per-layer
table, routing agreement per token, DSpark acceptance, and each run opened in Inspect or downloaded."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from engine.trace import Trace

from ..inspect.export import trace_bytes
from ..inspect.overlay_scale import Scale
from ..inspect.panel_style import thinned_categories, titled
from ..inspect.run_diff import RunDiff, TokenAlignment, diff_traces
from ..inspect.tokens import visible
from .diff_diagram import diff_on_diagram
from .plain_text import literal
from .static_table import show_table

DIFF = "compare_runs_diff"    # (key, RunDiff): the last diff, recomputed only when a trace changes
DIFFERS, FIRST = "#fde68a", "#b45309"
ROUNDING = {"load entropy (bits)": 2, "Engram gate": 3, "mHC gain": 4, "agreement": 2}


@dataclass(frozen=True)
class Side:
    label: str           # "A" or "B"
    trace: Trace
    model: str
    file_name: str = ""  # the uploaded file it came from, if any


def diff_of(a: Side, b: Side) -> RunDiff:
    key = tuple((id(s.trace), len(s.trace.tokens(0)), str(s.trace.meta.get("finish", ""))) for s in (a, b))
    held = st.session_state.get(DIFF)
    if held is None or held[0] != key:
        held = (key, diff_traces(a.trace, b.trace))
        st.session_state[DIFF] = held
    return held[1]


def show_diff(a: Side, b: Side) -> None:
    diff = diff_of(a, b)
    st.subheader("The two runs side by side")
    random = [f"{s.label} ({literal(s.model)})" for s, f in ((a, diff.a), (b, diff.b)) if f.random_weights]
    if random:
        st.warning(f"{' and '.join(random)} {'has' if len(random) == 1 else 'have'} random weights: the text is "
                   "noise; routing, gates and drafts are the real machinery on random parameters.",
                   icon=":material/casino:")
    headline(diff)
    cols = st.columns(2)
    for col, side in zip(cols, (a, b)):
        facts = diff.a if side.label == "A" else diff.b
        with col.container(border=True, key=f"compare_output_{side.label.lower()}"):
            source = f" · from {literal(side.file_name)}" if side.file_name else ""
            st.markdown(f"**{side.label}** · {literal(side.model or 'unknown model')} · "
                        f"{facts.n_prompt_tokens} prompt + {facts.n_generated} new tokens{source}")
            st.html(output_html(diff.tokens, side.label))
    st.caption("Highlighted: a token that differs from the other run's token at the same index (prompt tokens "
               "by prompt index, new tokens by generation step); outlined: the first divergence. Tokens are "
               "compared by their text. Hover a token for its position, id and the other run's token.")
    layers_table(diff)
    diff_on_diagram(diff, a.trace, b.trace, a.model)
    routing(diff)
    dspark(diff)
    with st.expander("Every token, aligned"):
        table = diff.tokens.table.copy()
        for side in "AB":
            table[f"{side} text"] = table[f"{side} text"].map(visible)
        st.dataframe(table, hide_index=True, width="stretch")
    handover(a, b)


def headline(diff: RunDiff) -> None:
    t = diff.tokens
    c = st.columns(4)
    c[0].metric("new tokens that agree", f"{t.generated_agree} of {t.generated_compared}")
    first = "none" if t.first_divergence is None else f"position {t.first_divergence}"
    c[1].metric("first divergence", first, help="the first position where the two token sequences differ; "
                "before it both models read the same text" + ("" if t.prompt_same else " (the prompts differ)"))
    if not diff.routing_comparable:
        c[2].metric("routing agreement", "not comparable", help=diff.routing_note)
    else:
        value = diff.routing_agreement if not math.isnan(diff.routing_agreement) else diff.routing_agreement_all
        c[2].metric("routing agreement", "–" if math.isnan(value) else f"{value:.2f}",
                    help="mean Jaccard overlap of the experts both runs chose for the same token and layer, over the "
                         "tokens both models read identically (all shared tokens when there are none)")
    lengths = [f"{s} {f.dspark.mean_accepted_length:.2f}" for s, f in (("A", diff.a), ("B", diff.b)) if f.dspark]
    c[3].metric("DSpark accepted length", " · ".join(lengths) or "off",
                help="tokens committed per DSpark step (accepted drafts + the target's token)")
    if diff.routing_comparable:
        st.caption(f"Routing agreement: {diff.routing_agreement:.2f} over same-input tokens, "
                   f"{diff.routing_agreement_all:.2f} over every token both recorded; independent uniform choices "
                   f"would agree {diff.chance_agreement:.2f} on average. Note: {diff.routing_note}.")
    else:
        st.caption(f"Routing agreement is {diff.routing_note}.")


def output_html(alignment: TokenAlignment, side: str) -> str:
    """One run's tokens (prompt in bold) with those that differ from the other run highlighted and the first
    divergence outlined; each token's hover names its position, id and the other run's token."""
    other = "B" if side == "A" else "A"
    spans = []
    for r in alignment.table.to_dict("records"):
        pos = int(r[f"{side} pos"])
        if pos < 0:
            continue
        text = html.escape(r[f"{side} text"]).replace("\n", "⏎\n") or "∅"
        theirs = (f"{other} has the same token" if r["same"] else f"{other} has nothing here"
                  if int(r[f"{other} pos"]) < 0 else f"{other} has '{visible(r[f'{other} text'])}'")
        tip = html.escape(f"position {pos} · id {int(r[f'{side} id'])} · {theirs}", quote=True)
        style = "border-radius:3px;padding:0 1px;"
        if not r["same"]:
            style += f"background:{DIFFERS};"
        if pos == alignment.first_divergence:
            style += f"outline:2px solid {FIRST};"
        tag = "b" if r["part"] == "prompt" else "span"
        spans.append(f'<{tag} title="{tip}" style="{style}">{text}</{tag}>')
    return ('<div style="white-space:pre-wrap;overflow-wrap:anywhere;font-family:monospace;line-height:1.8">'
            + "".join(spans) + "</div>")


def layers_table(diff: RunDiff) -> None:
    st.markdown("**Per layer** — A's and B's facts side by side")
    table = diff.layers.copy()
    for col in table.columns:
        digits = next((d for name, d in ROUNDING.items() if name in col), None)
        if digits is not None:
            table[col] = table[col].astype(float).round(digits)
    show_table(table, scroll_height=640)
    st.caption("Router: hash-routed layers (V4's first MoE layers) pick experts from the token id through a fixed "
               "table; learned ones from the router's scores. Load entropy: of the layer's expert load over the run "
               "(log2 of the expert count when balanced). Engram gate: mean over tokens and streams, empty where the "
               "layer has no Engram. mHC gain: of the composite residual mixing after the layer, mean over tokens "
               "(1 = no amplification). Agreement: mean Jaccard of the chosen experts. Draft stages are left out.")


def routing(diff: RunDiff, key: str = "compare_routing_chart") -> None:
    """The routing agreement per layer and token as a heatmap (the chart's element key: `key`)."""
    if not diff.routing_comparable or diff.routing.empty:
        return
    r = diff.routing
    layers = list(dict.fromkeys(r["layer"]))
    positions = sorted(set(r["pos"]))
    z = np.full((len(layers), len(positions)), np.nan)
    text = [[""] * len(positions) for _ in layers]
    for line in r.to_dict("records"):
        i, j = layers.index(line["layer"]), positions.index(line["pos"])
        z[i, j] = line["jaccard"]
        text[i][j] = f"A {line['A experts']} · B {line['B experts']}"
    x = [str(p) for p in positions]
    y = [_routing_label(diff, path) for path in layers]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, zmin=0, zmax=1, colorscale=Scale.agreement().plotly_scale(),
                               customdata=text,
                               colorbar={"title": "Jaccard"}, xgap=1, ygap=1,
                               hovertemplate="%{y} · position %{x}: %{z:.2f}<br>%{customdata}<extra></extra>"))
    shared = diff.tokens.shared_prefix
    if 0 < shared <= positions[-1]:
        fig.add_vline(x=positions.index(shared) - 0.5 if shared in positions else len(positions) - 0.5,
                      line_dash="dot", line_color=FIRST)
    fig.update_layout(yaxis={"autorange": "reversed"},
                      xaxis_title="position (right of the dotted line the two runs read different tokens)")
    titled(fig, "routing agreement per layer and token (hover: the experts each run chose)",
           height=max(300, 26 * len(layers) + 150), legend=False)
    st.plotly_chart(thinned_categories(fig, x, upright=False), key=key, width="stretch",
                    config={"displayModeBar": False})


def _routing_label(diff: RunDiff, path: str) -> str:
    """'layers.0.ffn (hash-routed in A)': a V4 layer whose experts come from the token id, not from scores."""
    n = int(path.split(".")[1])
    hashed = [side for side, facts in (("A", diff.a), ("B", diff.b)) if n < facts.n_hash_layers]
    return path + (f" (hash-routed in {' and '.join(hashed)})" if hashed else "")


def dspark(diff: RunDiff) -> None:
    if diff.dspark.empty:
        st.caption(f"DSpark: {diff.dspark_note[:1].lower()}{diff.dspark_note[1:]}")
        return
    st.markdown("**DSpark** — acceptance per draft position (P(draft k kept | drafts before it kept))")
    table = diff.dspark.dropna(how="all", subset=[c for c in diff.dspark.columns if c != "draft position"])
    show_table(table.round(2))
    lines = [f"{s}: {f.dspark.steps} steps, mean accepted length {f.dspark.mean_accepted_length:.2f}"
             for s, f in (("A", diff.a), ("B", diff.b)) if f.dspark]
    st.caption(" · ".join(lines) + (f". {diff.dspark_note}" if diff.dspark_note else "") +
               ". Draft positions no step reached are left out.")


def handover(a: Side, b: Side) -> None:
    """Each run opened in the Inspect page (every panel), or downloaded as a trace file."""
    cols = st.columns(2)
    for col, side in zip(cols, (a, b)):
        c = col.columns(2)
        if c[0].button(f"Open {side.label} in Inspect", key=f"compare_open_{side.label.lower()}",
                       icon=":material/monitoring:"):
            from .inspect_page import show_trace  # imports torch: only when a run is handed over
            show_trace(side.trace, side.file_name or f"run {side.label} of the Compare page")
            st.switch_page("pages/inspect.py")
        c[1].download_button(f"Download {side.label}'s trace", partial(trace_bytes, side.trace, "json"),
                             file_name=f"trace_{side.label.lower()}.json", mime="application/json",
                             key=f"compare_download_{side.label.lower()}", icon=":material/download:",
                             on_click="ignore")
