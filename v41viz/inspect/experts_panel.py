"""Experts panel: token × layer choices, per-layer load against uniform, experts touched per batch, a token's top-k."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.accounting.experts_touched import expected_touched
from engine.trace import Trace, path_order

from .links import related
from .panel_style import (
    categorical_scale,
    clickable_cells,
    mark_token,
    ratio_scale,
    thinned_categories,
    titled,
    width_thinned_categories,
)
from .tokens import axis_labels, labels
from .trace_model import trace_model


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


LABELLED_TOKENS = 24   # up to this many tokens each cell writes its experts; beyond, a colour bar names the ids
TICK_PX = 18           # the colour bar's labels at least this far apart (16 on one layer's short chart overlapped)


def _height(n_paths: int) -> int:
    return max(300, 26 * n_paths + 170)


def _id_colorbar(n: int, n_paths: int) -> dict:
    """Expert-id labels on the colour bar, thinned so that they never overlap on a short chart."""
    room = max(1, (_height(n_paths) - 150) // TICK_PX)   # the plot area's height less the token axis, in labels
    ticks = list(range(0, n, max(1, -(-n // room))))
    return dict(title="top expert", tickvals=ticks, ticktext=[f"e{e}" for e in ticks])


def choice_heatmap(trace: Trace, row: int = 0, only: str | None = None, n_experts: int | None = None,
                   pos: int | None = None) -> go.Figure:
    """Cell colour = the expert with the largest routing weight, one palette colour per expert id (ids are
    categories, Kelly's colours); the cells write every chosen expert, or past LABELLED_TOKENS tokens a colour bar
    with thinned labels names the ids (16 labels overlapped on one layer's short chart). n_experts: the recording
    model's (from the trace); pos: the selected token, outlined."""
    paths = moe_paths(trace, only)
    positions, ids, weights, scores = choice_grid(trace, row, paths)
    n = max(n_experts or trace_model(trace).n_routed_experts, int(ids.max()) + 1 if ids.size else 1)
    top = np.take_along_axis(ids, np.argmax(np.nan_to_num(weights, nan=-1.0), -1)[..., None], -1)[..., 0] \
        if ids.size else np.zeros((len(paths), len(positions)), np.int64)  # [P, T]
    text = [[",".join(str(e) for e in ids[i, j] if e >= 0) for j in range(len(positions))] for i in range(len(paths))]
    names = labels(trace, row, positions)
    hover = [[f"{names[j]}<br>" + ("<br>".join(f"expert {e}: weight {w:.3f}, score {s:.3f}" for e, w, s in
                                              zip(ids[i, j], weights[i, j], scores[i, j]) if e >= 0) or "not recorded")
              for j in range(len(positions))] for i in range(len(paths))]
    z = np.where(top >= 0, top, np.nan).astype(float)
    x = axis_labels(trace, row, positions)
    hashed = trace_model(trace).n_hash_layers  # V4: these layers pick experts from the token id (tid2eid)
    y = [f"{p} (hash-routed)" if p.startswith("layers.") and int(p.split(".")[1]) < hashed else p for p in paths]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, text=text, textfont=dict(size=9),
                               texttemplate="%{text}" if len(positions) <= LABELLED_TOKENS else "",  # narrow: hover
                               customdata=hover, hovertemplate="%{y} · %{customdata}<extra></extra>",
                               colorscale=categorical_scale(n), zmin=-0.5, zmax=n - 0.5, xgap=1, ygap=1,
                               showscale=len(positions) > LABELLED_TOKENS, colorbar=_id_colorbar(n, len(paths))))
    fig.update_layout(height=_height(len(paths)), margin=dict(l=10, r=10, t=30, b=10),
                      yaxis=dict(autorange="reversed", title=None), xaxis=dict(title="token (position:text)"),
                      title=dict(text="chosen experts per token and layer", font=dict(size=13)))
    fig = clickable_cells(mark_token(fig, positions, pos))
    # past LABELLED_TOKENS the colour bar takes room from the plot (about 310 px of it in a 1000 px window, where
    # 24 fixed labels overlapped): the labels are thinned to the drawn width; up to it every token is labelled
    return width_thinned_categories(fig) if len(positions) > LABELLED_TOKENS else thinned_categories(fig, x)


def load_table(trace: Trace, paths: list[str], n_experts: int) -> pd.DataFrame:
    """Per layer: tokens routed to each expert ÷ the uniform share (k·T/E); 1.0 = perfectly balanced."""
    rows = []
    for p in paths:
        load = trace.expert_load(p, n_experts)
        uniform = load.sum() / n_experts
        rows.append({"layer": p, **{f"e{e}": (load[e] / uniform if uniform else np.nan) for e in range(n_experts)},
                     "max/uniform": load.max() / uniform if uniform else np.nan, "tokens×k": int(load.sum())})
    return pd.DataFrame(rows)


def load_figure(trace: Trace, n_experts: int | None = None, only: str | None = None) -> go.Figure:
    """Per backbone layer and expert: tokens routed ÷ the uniform share. The colour bar runs from 0 (a ratio is
    never negative) with white at 1 (balanced)."""
    n_experts = n_experts or trace_model(trace).n_routed_experts
    paths = [p for p in moe_paths(trace, only) if p.startswith("layers.")]
    table = load_table(trace, paths, n_experts)
    z = table[[f"e{e}" for e in range(n_experts)]].to_numpy(float) if len(table) else np.zeros((0, n_experts))
    top = max(2.0, float(np.nanmax(z))) if z.size and np.isfinite(z).any() else 2.0
    x = [str(e) for e in range(n_experts)]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=paths, zmin=0.0, zmax=top, colorscale=ratio_scale(top),
                               text=np.round(z, 2), texttemplate="%{text}", textfont=dict(size=9),
                               colorbar=dict(title="÷ uniform", tick0=0, dtick=1 if top <= 6 else None),
                               hovertemplate="%{y} · expert %{x}: %{z:.2f}× the uniform load<extra></extra>"))
    fig.update_layout(height=max(300, 26 * len(paths) + 150), margin=dict(l=10, r=10, t=30, b=10),
                      yaxis=dict(autorange="reversed"), xaxis=dict(title="expert"),
                      title=dict(text="load per backbone layer against uniform (1.0 = balanced)", font=dict(size=13)))
    return thinned_categories(fig, x, max_labels=8, upright=False)


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


def touched_figure(trace: Trace) -> go.Figure:
    """Distinct experts a batch of B tokens reads per backbone layer: the closed form E·(1−(1−k/E)^B) for the
    recording model's E and k, and what this run measured (consecutive tokens as the batch)."""
    facts = trace_model(trace)
    e, k = facts.n_routed_experts, facts.n_activated_experts
    measured = measured_touched(trace)
    batches = [2 ** i for i in range(12)]
    fig = go.Figure()
    if e and k:
        fig.add_scatter(x=batches, y=[expected_touched(e, k, b) for b in batches], mode="lines+markers",
                        name=f"closed form: E={e}, k={k}")
    if measured:
        fig.add_scatter(x=list(measured), y=list(measured.values()), mode="markers", name="measured (this run)",
                        marker=dict(size=10, symbol="diamond"))
    fig.update_layout(xaxis=dict(type="log", title="tokens in batch B", tickvals=batches[::2]),
                      yaxis=dict(title="distinct experts per layer", rangemode="tozero"))
    return titled(fig, "experts read by B consecutive tokens", height=360)


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
