"""Logit lens panel: what each layer's read-out predicts at a token, the residual-stream RMS per layer, log-probs."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.trace import Trace

from .links import related
from .panel_style import clickable_cells, mark_token, thinned_categories, titled
from .tokens import axis_labels, labels, probability_text, visible

TextOf = Callable[[int], str]


def lens_paths(trace: Trace, only: str | None = None) -> list[str]:
    """The layers with lens records (under the module filter `only`, when it names one of them)."""
    paths = trace.paths("lens")
    return [p for p in paths if related(p, only)] or paths


def layer_records(trace: Trace, row: int, pos: int, paths: list[str]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(path, lens record) of each layer that has one at (row, pos), in depth order."""
    found = ((p, trace.fact("lens", p, row, pos)) for p in paths)
    return [(p, rec) for p, rec in found if rec is not None]


def quoted(token_id: int, token_text: TextOf) -> str:
    return f"'{visible(token_text(int(token_id)))}'"


def next_token(records: list[tuple[str, dict]]) -> int:
    """The token that followed the position (the model's choice, or the prompt's next token); -1 when none did."""
    return int(records[-1][1]["next_id"]) if records else -1


def lens_table(trace: Trace, row: int, pos: int, token_text: TextOf, paths: list[str] | None = None) -> pd.DataFrame:
    """Layers down: the read-out's top token and its probability, the runners-up, and the rank and probability the
    layer gives the token that actually came next."""
    records = layer_records(trace, row, pos, lens_paths(trace) if paths is None else paths)
    nxt = next_token(records)
    chosen = quoted(nxt, token_text) if nxt >= 0 else "the next token"
    out = []
    for path, rec in records:
        ids, probs = rec["top_ids"].tolist(), rec["top_probs"].tolist()
        rank = int(rec["next_rank"])
        out.append({"layer": path,
                    "top token": quoted(ids[0], token_text) if ids else "–",
                    "p": probability_text(probs[0]) if ids else "–",
                    "runners-up": " · ".join(f"{quoted(i, token_text)} {probability_text(p)}"
                                             for i, p in zip(ids[1:], probs[1:])),
                    f"rank of {chosen}": rank if rank > 0 else "–",
                    f"p of {chosen}": probability_text(float(rec["next_prob"])) if rank > 0 else "–"})
    return pd.DataFrame(out, columns=["layer", "top token", "p", "runners-up", f"rank of {chosen}", f"p of {chosen}"])


def lens_figure(trace: Trace, row: int, pos: int, token_text: TextOf, paths: list[str] | None = None) -> go.Figure:
    """Layers down: each layer's top-token probability (bar, labelled with the token) and the probability it gives
    the token that came next (diamond)."""
    records = layer_records(trace, row, pos, lens_paths(trace) if paths is None else paths)
    layers = [p for p, _ in records]
    top_p = [float(r["top_probs"][0]) if r["top_probs"].size else math.nan for _, r in records]
    top_text = [quoted(r["top_ids"][0], token_text) if r["top_ids"].size else "" for _, r in records]
    nxt = next_token(records)
    fig = go.Figure()
    fig.add_bar(y=layers, x=top_p, orientation="h", name="top token of the layer", marker_color="#9db8d9",
                text=top_text, textposition="outside", cliponaxis=False,
                hovertemplate="%{y}: top token %{text}, p %{x:.4f}<extra></extra>")
    if nxt >= 0:
        fig.add_scatter(y=layers, x=[float(r["next_prob"]) for _, r in records], mode="markers+lines",
                        name=f"next token {quoted(nxt, token_text)}", marker=dict(symbol="diamond", size=10,
                                                                               color="#c8741c"),
                        customdata=[int(r["next_rank"]) for _, r in records],
                        hovertemplate="%{y}: p %{x:.4f}, rank %{customdata}<extra></extra>")
    fig.update_yaxes(autorange="reversed", type="category", title="layer (read out after it)")
    shown = top_p + [float(r["next_prob"]) for _, r in records]
    top = max([p for p in shown if p == p] + [1e-6])
    fig.update_xaxes(title="probability", range=[0, 1.35 * top])   # (room for the labels after the bars)
    title = f"Logit lens at {labels(trace, row, [pos], 24)[0]}: each layer's prediction of the next token"
    return titled(fig, title, height=max(300, 110 + 34 * len(layers)))


def norm_figure(trace: Trace, row: int, pos: int, paths: list[str] | None = None) -> go.Figure:
    """Per layer, the RMS of each hc stream leaving it (lines) and the mean over the streams entering it (dashes)."""
    records = layer_records(trace, row, pos, lens_paths(trace) if paths is None else paths)
    layers = [p for p, _ in records]
    fig = go.Figure()
    if records:
        rms_out = np.stack([r["rms_out"] for _, r in records])                      # [layers, hc]
        rms_in = np.stack([r["rms_in"] for _, r in records])
        fig.add_scatter(x=layers, y=rms_in.mean(1), mode="lines+markers", name="entering (mean of the streams)",
                        line=dict(dash="dash", color="#6b7280"))
        for s in range(rms_out.shape[1]):
            fig.add_scatter(x=layers, y=rms_out[:, s], mode="lines+markers", name=f"leaving, stream {s}")
    fig.update_yaxes(title="RMS over dim", rangemode="tozero")
    fig.update_xaxes(type="category")
    return titled(fig, f"Residual-stream RMS per layer at {labels(trace, row, [pos], 24)[0]}", height=340)


def next_token_grid(trace: Trace, row: int, paths: list[str]) -> tuple[list[int], np.ndarray]:
    """(positions, probability [layers, positions] each layer gives the token that came next; NaN: none)."""
    positions = sorted({pos for p, _, r, pos, _ in trace.facts("lens") if r == row and p in paths})
    grid = np.full((len(paths), len(positions)), np.nan)
    column = {p: j for j, p in enumerate(positions)}
    index = {p: i for i, p in enumerate(paths)}
    for p, _, r, pos, values in trace.facts("lens"):
        if r == row and p in index and int(values[3]) > 0:
            grid[index[p], column[pos]] = float(values[4])
    return positions, grid


def next_token_heatmap(trace: Trace, row: int = 0, paths: list[str] | None = None,
                       pos: int | None = None) -> go.Figure:
    """Layers × tokens: log10 of the probability each layer gives the token that came next (where the
    prediction forms in depth, over the whole run); the selected token outlined."""
    paths = lens_paths(trace) if paths is None else paths
    positions, grid = next_token_grid(trace, row, paths)
    x, names = axis_labels(trace, row, positions), labels(trace, row, positions)
    with np.errstate(divide="ignore"):
        z = np.log10(np.maximum(grid, 1e-12))
    fig = go.Figure(go.Heatmap(z=z, x=x, y=paths, colorscale="Viridis", zmin=-6, zmax=0,
                               colorbar=dict(title="log10 p"), customdata=[names] * len(paths),
                               hovertemplate="%{y} · %{customdata}: log10 p(next) %{z:.2f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(xaxis=dict(title="token (position:text)"))
    fig = titled(fig, "Probability each layer gives the token that came next", height=max(300, 120 + 26 * len(paths)),
                 legend=False)
    return thinned_categories(clickable_cells(mark_token(fig, positions, pos)), x)


def logprob_figure(trace: Trace, row: int = 0, pos: int | None = None) -> go.Figure:
    """Each token's log-probability under the model: prompt tokens teacher-forced (from the prompt's logits),
    generated ones from the distribution they were drawn from; the selected token marked."""
    tokens = [t for t in trace.tokens(row) if t.logprob == t.logprob]
    fig = go.Figure()
    for generated, name, colour in ((False, "prompt (teacher-forced)", "#3b6ea5"), (True, "generated", "#c8741c")):
        part = [t for t in tokens if t.generated == generated]
        if part:
            fig.add_bar(x=axis_labels(trace, row, [t.pos for t in part]), y=[t.logprob for t in part], name=name,
                        marker_color=colour, customdata=labels(trace, row, [t.pos for t in part]),
                        hovertemplate="%{customdata}: log p %{y:.3f}<extra></extra>")
    x = axis_labels(trace, row, [t.pos for t in tokens])
    if pos is not None and any(t.pos == pos for t in tokens):
        fig.add_vline(x=x[[t.pos for t in tokens].index(pos)], line=dict(color="#111827", dash="dot"))
    fig.update_yaxes(title="log p (natural)")
    fig.update_xaxes(categoryorder="array", categoryarray=x)
    return thinned_categories(titled(fig, "Log-probability of each token under the model", height=320), x)
