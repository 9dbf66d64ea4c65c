"""Attention panel (opt-in trace): window vs compressed vs sink share per layer, the indexer's picks for a token."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.trace import Trace

from .links import related
from .panel_style import thinned_categories, titled


def attention_paths(trace: Trace, only: str | None = None) -> list[str]:
    return [p for p in trace.paths("attention") if related(p, only)]


def share_table(trace: Trace, row: int = 0, only: str | None = None) -> pd.DataFrame:
    """Mean attention mass per layer on the sliding window, the compressed entries and the sink."""
    acc: dict[str, list] = {}
    for p, _, r, _, (_, win, comp, sink) in trace.facts("attention"):
        if r == row and related(p, only):
            acc.setdefault(p, []).append((float(win), float(comp), float(sink)))
    rows = [{"layer": p, "window": np.mean([v[0] for v in vals]), "compressed": np.mean([v[1] for v in vals]),
             "sink": np.mean([v[2] for v in vals]), "tokens": len(vals)} for p, vals in acc.items()]
    return pd.DataFrame(rows, columns=["layer", "window", "compressed", "sink", "tokens"])


def share_figure(trace: Trace, row: int = 0, only: str | None = None) -> go.Figure:
    t = share_table(trace, row, only)
    fig = go.Figure()
    for col, colour in (("window", "#9ca3af"), ("compressed", "#3b6ea5"), ("sink", "#c8741c")):
        fig.add_bar(x=t["layer"], y=t[col], name=col, marker_color=colour)
    fig.update_layout(barmode="stack", yaxis_title="mean mass")
    return thinned_categories(titled(fig, "where attention goes, averaged over tokens", height=360), list(t["layer"]))


def chosen_positions(trace: Trace, row: int, pos: int) -> pd.DataFrame:
    """The indexer's top-k compressed entries for the token at `pos`, per layer that has an indexer
    (−1 slots, meaning nothing to choose yet, are dropped)."""
    rows = []
    for p in trace.paths("attention"):
        rec = trace.fact("attention", p, row, pos)
        if rec is None or rec["topk"].size == 0:
            continue
        picks = sorted(int(i) for i in rec["topk"].reshape(-1) if i >= 0)
        rows.append({"layer": p, "chosen compressed entries": picks, "n": len(picks),
                     "window": float(rec["window_mass"]), "compressed": float(rec["compressed_mass"])})
    return pd.DataFrame(rows, columns=["layer", "chosen compressed entries", "n", "window", "compressed"])


def chosen_figure(trace: Trace, row: int, pos: int) -> go.Figure:
    t = chosen_positions(trace, row, pos)
    xs, ys = [], []
    for layer, picks in zip(t["layer"], t["chosen compressed entries"]):
        xs += picks
        ys += [layer] * len(picks)
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", marker=dict(size=11, symbol="square", color="#3b6ea5"),
                               hovertemplate="%{y}: compressed entry %{x}<extra></extra>"))
    fig.update_layout(height=max(220, 30 * len(t) + 100), margin=dict(l=10, r=10, t=30, b=10),
                      xaxis_title="compressed entry index (covers ratio × index source tokens)",
                      yaxis=dict(autorange="reversed"),
                      title=dict(text=f"indexer top-k for the token at position {pos}", font=dict(size=13)))
    return fig
