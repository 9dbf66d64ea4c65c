"""DSpark panel: each step's drafts coloured by verdict, confidences and survival; acceptance over the run."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.dspark.metrics import DSparkMetrics, summarize
from engine.trace import DSparkStep, Trace

from .panel_style import titled

VERDICT_COLOURS = {"accepted": "#bbf7d0", "rejected": "#fecaca", "not verified": "#e5e7eb"}


def steps(trace: Trace, row: int = 0) -> list[DSparkStep]:
    return sorted((s for s in trace.dspark_steps if s.row == row), key=lambda s: s.step)


def verdicts(step: DSparkStep) -> list[str]:
    """Per drafted slot: accepted (kept), rejected (the first verified draft the verifier refused) or not verified."""
    out = []
    for k in range(len(step.drafted)):
        if k < step.accepted:
            out.append("accepted")
        elif k == step.accepted and k < step.verify_len:
            out.append("rejected")
        else:
            out.append("not verified")
    return out


def steps_table(trace: Trace, token_text, row: int = 0) -> pd.DataFrame:
    rows = []
    for s in steps(trace, row):
        rows.append({"step": s.step, "anchor pos": s.anchor_pos, "anchor": token_text(s.anchor_token),
                     "drafted": [token_text(int(t)) for t in s.drafted],
                     "confidence": [round(float(c), 3) for c in s.confidences],
                     "survival": [round(float(a), 3) for a in s.survival],
                     "scheduled": s.verify_len, "accepted": s.accepted,
                     "target token": token_text(s.next_token), "kind": s.next_kind,
                     "ms": round(s.time_s * 1e3, 1)})
    return pd.DataFrame(rows)


def chip(text: str) -> str:
    """A token's text for one chip of a step line: escaped, a newline shown as ⏎ (the line stays one line)."""
    return html.escape(text).replace("\n", "⏎") or "∅"


def steps_html(trace: Trace, token_text, row: int = 0, limit: int = 40) -> str:
    """One line per step: [anchor] then drafts on green (accepted), red (rejected), grey (not verified),
    then the replacement or bonus token the target supplied; hover shows confidence and survival."""
    lines = []
    for s in steps(trace, row)[:limit]:
        cells = [f'<span style="border:1px solid #6b7280;border-radius:3px;padding:0 3px">'
                 f'{chip(token_text(s.anchor_token))}</span>']
        for k, v in enumerate(verdicts(s)):
            tip = f"{v}; q={s.draft_probs[k]:.3f}"
            if k < len(s.confidences):
                tip += f", confidence {s.confidences[k]:.3f}, survival {s.survival[k]:.3f}"
            cells.append(f'<span title="{tip}" style="background:{VERDICT_COLOURS[v]};border-radius:3px;'
                         f'padding:0 3px">{chip(token_text(int(s.drafted[k])))}</span>')
        cells.append(f'<span title="{s.next_kind} from the target" style="text-decoration:underline">'
                     f'→ {chip(token_text(s.next_token))}</span>')
        lines.append(f'<div><b>step {s.step}</b> (sent {s.verify_len}, kept {s.accepted}) '
                     + " ".join(cells) + "</div>")
    return '<div style="font-family:monospace;line-height:1.9;white-space:pre">' + "".join(lines) + "</div>"


def metrics(trace: Trace, row: int | None = None) -> DSparkMetrics:
    chosen = trace.dspark_steps if row is None else steps(trace, row)
    return summarize(chosen)


def accepted_trace_figure(trace: Trace, row: int = 0) -> go.Figure:
    """Tokens committed per step (accepted drafts + the target's token) and the scheduled length."""
    ss = steps(trace, row)
    fig = go.Figure()
    fig.add_scatter(x=[s.step for s in ss], y=[s.accepted + 1 for s in ss], mode="lines+markers",
                    name="committed (accepted + 1)")
    fig.add_scatter(x=[s.step for s in ss], y=[s.verify_len for s in ss], mode="lines", line=dict(dash="dot"),
                    name="scheduled drafts")
    fig.update_layout(xaxis_title="step", yaxis_title="tokens")
    return titled(fig, "accepted length over the generation")


def accepted_histogram(trace: Trace, row: int = 0) -> go.Figure:
    ss = steps(trace, row)
    gamma = max((len(s.drafted) for s in ss), default=0)
    counts = np.bincount([s.accepted for s in ss], minlength=gamma + 1) if ss else np.zeros(1, np.int64)
    fig = go.Figure(go.Bar(x=list(range(len(counts))), y=counts, marker_color="#3b6ea5"))
    fig.update_layout(height=280, margin=dict(l=10, r=10, t=30, b=10), xaxis_title="accepted drafts in a step",
                      yaxis_title="steps", title=dict(text="accepted-length histogram", font=dict(size=13)))
    return fig


def acceptance_figure(m: DSparkMetrics) -> go.Figure:
    """Per draft position: conditional acceptance, and calibration (predicted survival vs observed)."""
    k = list(range(1, len(m.conditional_acceptance) + 1))
    fig = go.Figure()
    fig.add_bar(x=k, y=m.conditional_acceptance, name="P(accept k | 1..k−1 accepted)", marker_color="#9ca3af")
    fig.add_scatter(x=k, y=m.predicted_survival, mode="lines+markers", name="predicted survival (mean a_k)")
    fig.add_scatter(x=k, y=m.observed_survival, mode="lines+markers", name="observed (drafts 1..k accepted)")
    fig.update_layout(xaxis_title="draft position k", yaxis=dict(range=[0, 1.05], title="probability"),
                      legend=dict(orientation="v"))
    return titled(fig, "per-position acceptance and calibration", height=360)
