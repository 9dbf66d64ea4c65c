"""Experts panel: token × layer choices, per-layer load against uniform, experts touched per batch, a token's top-k."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.trace import Trace, path_order

from .links import related
from .tokens import labels


def moe_paths(trace: Trace, only: str | None = None) -> list[str]:
    """Traced MoE layers ('layers.3.ffn', 'mtp.0.ffn'), optionally those under one module path."""
    return [p for p in trace.paths("moe") if related(p, only)]


def choice_grid(trace: Trace, row: int, paths: list[str]):
    """(positions, ids [P, T, k], weights, scores) with -1 / NaN where a token has no record at a layer."""
    recs = {(p, pos): v for p, _, r, pos, v in trace.facts("moe") if r == row and p in paths}
    positions = sorted({pos for _, pos in recs})
    k = max((v[0].shape[0] for v in recs.values()), default=0)
    ids = np.full((len(paths), len(positions), k), -1, np.int64)
    weights = np.full(ids.shape, np.nan, np.float32)
    scores = np.full(ids.shape, np.nan, np.float32)
    for i, p in enumerate(paths):
        for j, pos in enumerate(positions):
            v = recs.get((p, pos))
            if v is not None:
                n = v[0].shape[0]
                ids[i, j, :n], weights[i, j, :n], scores[i, j, :n] = v[0], v[1], v[2]
    return positions, ids, weights, scores


def choice_heatmap(trace: Trace, row: int = 0, only: str | None = None) -> go.Figure:
    """Cell colour = the expert with the largest routing weight; the cell text lists every chosen expert."""
    paths = moe_paths(trace, only)
    positions, ids, weights, scores = choice_grid(trace, row, paths)
    top = np.take_along_axis(ids, np.argmax(np.nan_to_num(weights, nan=-1.0), -1)[..., None], -1)[..., 0] \
        if ids.size else np.zeros((len(paths), len(positions)), np.int64)  # [P, T]
    text = [[",".join(str(e) for e in ids[i, j] if e >= 0) for j in range(len(positions))] for i in range(len(paths))]
    hover = [[("<br>".join(f"expert {e}: weight {w:.3f}, score {s:.3f}" for e, w, s in
                           zip(ids[i, j], weights[i, j], scores[i, j]) if e >= 0) or "not recorded")
              for j in range(len(positions))] for i in range(len(paths))]
    z = np.where(top >= 0, top, np.nan).astype(float)
    fig = go.Figure(go.Heatmap(z=z, x=labels(trace, row, positions), y=paths, text=text, texttemplate="%{text}",
                               customdata=hover, hovertemplate="%{y} · %{x}<br>%{customdata}<extra></extra>",
                               colorscale="Turbo", colorbar=dict(title="top expert")))
    fig.update_layout(height=max(260, 26 * len(paths) + 120), margin=dict(l=10, r=10, t=30, b=10),
                      yaxis=dict(autorange="reversed", title=None), xaxis=dict(title="token (position:text)"),
                      title=dict(text="chosen experts per token and layer (hover: weights and scores)", font=dict(size=13)))
    return fig


def load_table(trace: Trace, paths: list[str], n_experts: int) -> pd.DataFrame:
    """Per layer: tokens routed to each expert ÷ the uniform share (k·T/E); 1.0 = perfectly balanced."""
    rows = []
    for p in paths:
        load = trace.expert_load(p, n_experts)
        uniform = load.sum() / n_experts
        rows.append({"layer": p, **{f"e{e}": (load[e] / uniform if uniform else np.nan) for e in range(n_experts)},
                     "max/uniform": load.max() / uniform if uniform else np.nan, "tokens×k": int(load.sum())})
    return pd.DataFrame(rows)


def load_figure(trace: Trace, n_experts: int, only: str | None = None) -> go.Figure:
    paths = [p for p in moe_paths(trace, only) if p.startswith("layers.")]
    table = load_table(trace, paths, n_experts)
    z = table[[f"e{e}" for e in range(n_experts)]].to_numpy(float) if len(table) else np.zeros((0, n_experts))
    fig = go.Figure(go.Heatmap(z=z, x=[str(e) for e in range(n_experts)], y=paths, zmid=1.0, colorscale="RdBu_r",
                               text=np.round(z, 2), texttemplate="%{text}", colorbar=dict(title="÷ uniform"),
                               hovertemplate="%{y} · expert %{x}: %{z:.2f}× the uniform load<extra></extra>"))
    fig.update_layout(height=max(240, 26 * len(paths) + 110), margin=dict(l=10, r=10, t=30, b=10),
                      yaxis=dict(autorange="reversed"), xaxis=dict(title="expert"),
                      title=dict(text="load per backbone layer against uniform (1.0 = balanced)", font=dict(size=13)))
    return fig


def measured_touched(trace: Trace, row: int = 0) -> dict[int, float]:
    """Distinct experts read per backbone layer by B consecutive tokens, averaged over layers and windows."""
    paths = [p for p in trace.paths("moe") if p.startswith("layers.")]
    positions, ids, _, _ = choice_grid(trace, row, paths)
    out, b = {}, 1
    while b <= len(positions):
        counts = [len({int(e) for e in ids[i, s:s + b].reshape(-1) if e >= 0})
                  for i in range(len(paths)) for s in range(0, len(positions) - b + 1)]
        out[b] = float(np.mean(counts))
        b *= 2
    return out


def token_topk(trace: Trace, row: int, pos: int) -> pd.DataFrame:
    """A token's chosen experts per MoE layer, best weight first."""
    rows = []
    for p in sorted(trace.paths("moe"), key=path_order):
        rec = trace.fact("moe", p, row, pos)
        if rec is None:
            continue
        order = np.argsort(-rec["weights"])
        rows.append({"layer": p, "experts": [int(rec["ids"][i]) for i in order],
                     "weights": [round(float(rec["weights"][i]), 4) for i in order],
                     "scores": [round(float(rec["scores"][i]), 4) for i in order],
                     "vision bias": bool(rec["vision"])})
    return pd.DataFrame(rows, columns=["layer", "experts", "weights", "scores", "vision bias"])
