"""Pictures of a checkpoint's learned parameters from engine.weights' long tables (view, module, tensor, layer,
axis, index, stat, value): boxes × index heatmaps, the Sinkhorn matrices of one layer, singular value curves, norm
gains per layer. Plotly only (no Streamlit, no torch)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

# What each index axis counts, for the x title
AXIS_TITLES = {"expert": "expert", "head": "head", "stream": "stream", "cell": "cell a·hc + b", "part": "part",
               "column": "column (n-gram size × head)", "block": "block (keys per stream, then the value)",
               "k": "singular value #", "tap": "tapped layer", "input": "input"}
SIGNED = {"bias", "bias_vl", "sink", "weight", "difference"}   # statistics drawn around zero


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["view", "module", "tensor", "layer", "axis", "index", "stat", "value"]) \
        if rows and "value" in rows[0] else pd.DataFrame(rows)


def stats_of(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["stat"])) if len(df) else []


def heatmap(df: pd.DataFrame, stat: str, focus: str = "", value: str = "value", title: str = "") -> go.Figure:
    """One statistic as boxes (rows, in layer order) × index (columns); the rows of the module `focus` is
    under are marked ◀."""
    d = df[df["stat"] == stat]
    order = d.drop_duplicates("module").sort_values(["layer", "module"], kind="stable")["module"].tolist()
    grid = d.pivot_table(index="module", columns="index", values=value, aggfunc="first").reindex(order)
    labels = [f"{m} ◀" if focus and (focus == m or focus.startswith(m + ".") or m.startswith(focus + "."))
              else m for m in grid.index]
    signed = stat in SIGNED or value == "difference"
    z = grid.to_numpy()
    fig = go.Figure(go.Heatmap(z=z, x=[str(c) for c in grid.columns], y=labels, colorscale="RdBu_r" if signed
                               else "Viridis", zmid=0 if signed else None, hoverongaps=False,
                               hovertemplate="%{y}<br>index %{x}<br>" + stat + " %{z:.5g}<extra></extra>"))
    axis = d["axis"].iloc[0] if len(d) else ""
    fig.update_layout(title=title or (stat if value == "value" else f"{stat}: {value}"),
                      height=min(900, 140 + 18 * len(labels)), margin=dict(l=10, r=10, t=40, b=40),
                      xaxis_title=AXIS_TITLES.get(axis, axis), yaxis_autorange="reversed",
                      xaxis_type="category")   # whole indices (heads, experts): no ticks at −0.5, 0.5, …
    return fig


def sinkhorn_matrices(df: pd.DataFrame, layer: int, hc: int) -> go.Figure | None:
    """The doubly stochastic comb matrices Sinkhorn makes of the static base alone, both seams of one layer."""
    d = df[(df["stat"] == "comb") & (df["layer"] == layer)]
    modules = list(dict.fromkeys(d["module"]))
    if not modules:
        return None
    fig = make_subplots(1, len(modules), subplot_titles=modules)
    for i, m in enumerate(modules, 1):
        cells = d[d["module"] == m].sort_values("index")["value"].to_numpy().reshape(hc, hc)
        fig.add_trace(go.Heatmap(z=cells, zmin=0, zmax=1, colorscale="Viridis", showscale=i == len(modules),
                                 hovertemplate="from stream %{x} to %{y}: %{z:.4f}<extra></extra>"), 1, i)
        fig.update_yaxes(autorange="reversed", row=1, col=i)
    fig.update_layout(title=f"Sinkhorn(base) at layer {layer}: static stream mixing", height=300,
                      margin=dict(l=10, r=10, t=60, b=20))
    return fig


def curves(df: pd.DataFrame, stats: tuple[str, ...], log: bool = True, title: str = "") -> go.Figure:
    """Statistics over their index as lines, one per tensor (singular value spectra)."""
    fig = go.Figure()
    for stat in stats:
        for tensor, d in df[df["stat"] == stat].groupby("tensor", sort=False):
            d = d.sort_values("index")
            fig.add_trace(go.Scatter(x=d["index"], y=d["value"], mode="lines+markers", name=f"{tensor} ({stat})"))
    fig.update_layout(title=title, height=340, margin=dict(l=10, r=10, t=40, b=40), yaxis_type="log" if log else None,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def norm_gains(df: pd.DataFrame, stat: str = "mean") -> go.Figure:
    """Every RMSNorm's gain statistic as layers × which norm (attn_norm, q_norm, ...)."""
    d = df[df["stat"] == stat].copy()
    d["which"] = [_norm_kind(t) for t in d["tensor"]]
    d["row"] = [f"layer {l}" if l >= 0 else "final" for l in d["layer"]]
    grid = d.pivot_table(index="row", columns="which", values="value", aggfunc="first")
    grid = grid.reindex(list(dict.fromkeys(d.sort_values("layer", kind="stable")["row"])))
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns), y=list(grid.index), colorscale="Viridis",
                               hoverongaps=False, hovertemplate="%{y} %{x}<br>" + stat + " %{z:.4g}<extra></extra>"))
    fig.update_layout(title=f"RMSNorm gains: {stat}", height=min(900, 140 + 18 * len(grid)),
                      margin=dict(l=10, r=10, t=40, b=40), yaxis_autorange="reversed")
    return fig


def _norm_kind(tensor: str) -> str:
    """layers.3.attn.q_norm.weight → attn.q_norm; norm.weight → norm."""
    parts = tensor.removesuffix(".weight").split(".")
    return ".".join(parts[2:]) if parts[0] in ("layers", "mtp") else ".".join(parts)
