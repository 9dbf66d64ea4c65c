"""Engram panel: per token the compressed id, the hashed rows by n-gram order and head, and the per-stream gates."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.trace import Trace

from .links import related
from .panel_style import clickable_cells, mark_token, thinned_categories
from .tokens import axis_labels, coloured_text_html, labels


def engram_paths(trace: Trace, only: str | None = None) -> list[str]:
    return [p for p in trace.paths("engram") if related(p, only)]


def rows_table(trace: Trace, facts, path: str, row: int, pos: int) -> pd.DataFrame:
    """The hashed table rows of one token: one line per n-gram order (2..N), one column per head. facts: the
    recording model's sizes (ModelArgs or TraceModel); with its N unknown (0) the rows form one line."""
    rec = trace.fact("engram", path, row, pos)
    if rec is None:
        raise KeyError(f"no Engram record for {path} at row {row}, position {pos}")
    n = int(getattr(facts, "engram_max_ngram_size", 0) or 0)
    if n < 2 or rec["row_ids"].size % (n - 1):
        return pd.DataFrame([rec["row_ids"].reshape(-1)], index=["rows"],
                            columns=[f"column {c}" for c in range(rec["row_ids"].size)])
    orders = n - 1
    ids = rec["row_ids"].reshape(orders, -1)  # [N-1, H]: the hash lays columns out order-major
    return pd.DataFrame(ids, index=[f"{g}-gram" for g in range(2, n + 1)],
                        columns=[f"head {h}" for h in range(ids.shape[1])])


def gate_grid(trace: Trace, path: str, row: int = 0) -> tuple[list[int], np.ndarray]:
    """(positions, gates [T, streams]) of one Engram layer."""
    recs = sorted((pos, v[2]) for p, _, r, pos, v in trace.facts("engram") if p == path and r == row)
    if not recs:
        return [], np.zeros((0, 0), np.float32)
    return [p for p, _ in recs], np.stack([g.reshape(-1) for _, g in recs])


def gate_figure(trace: Trace, path: str, row: int = 0, pos: int | None = None) -> go.Figure:
    """Stream × token heatmap of how much of the retrieved memory each mHC stream lets in (the selected token
    outlined)."""
    positions, gates = gate_grid(trace, path, row)
    x, names = axis_labels(trace, row, positions), labels(trace, row, positions)
    fig = go.Figure(go.Heatmap(z=gates.T, x=x, y=[f"stream {i}" for i in range(gates.shape[1])],
                               colorscale="Oranges", zmin=0, zmax=1, colorbar=dict(title="gate"),
                               customdata=[names] * gates.shape[1],
                               hovertemplate="%{y} · %{customdata}: gate %{z:.3f}<extra></extra>"))
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=30, b=10), xaxis=dict(title="token (position:text)"),
                      title=dict(text=f"{path}: gate per stream and token", font=dict(size=13)))
    return thinned_categories(clickable_cells(mark_token(fig, positions, pos)), x)


def token_summary(trace: Trace, path: str, row: int = 0) -> pd.DataFrame:
    """One line per token: its text, compressed id (−1 = not hashed) and gates."""
    texts = {t.pos: t.text for t in trace.tokens(row)}
    out = []
    for p, _, r, pos, (comp, _, gates) in trace.facts("engram"):
        if p == path and r == row:
            out.append({"pos": pos, "text": texts.get(pos, "?"), "compressed id": int(comp),
                        "mean gate": float(np.mean(gates)),
                        **{f"gate s{i}": float(g) for i, g in enumerate(gates.reshape(-1))}})
    return pd.DataFrame(out)


def gated_text_html(trace: Trace, path: str, row: int = 0) -> str:
    """The row's text, each token shaded by its mean gate at this layer (grey = not recorded)."""
    positions, gates = gate_grid(trace, path, row)
    mean = dict(zip(positions, gates.mean(1).tolist())) if len(positions) else {}
    toks = trace.tokens(row)
    return coloured_text_html([t.text for t in toks], [mean.get(t.pos, np.nan) for t in toks], f"{path} mean gate")
