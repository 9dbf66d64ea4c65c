"""mHC panel: the 4×4 mixing matrix at a seam and token, pre/post weights, Sinkhorn residuals, composite gain."""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from engine.trace import Trace, mhc_gain, path_order

from .panel_style import HALF_AXIS_LABELS, thinned_categories, titled


def positions(trace: Trace, row: int = 0) -> list[int]:
    return sorted({pos for _, _, r, pos, _ in trace.facts("mhc") if r == row})


def matrix_figure(trace: Trace, path: str, site: str, row: int, pos: int) -> go.Figure:
    """C[a, b]: how much of stream a flows into stream b at this seam (rows and columns sum to 1)."""
    c = trace.mhc_matrix(path, site, row, pos)
    fig = px.imshow(c, text_auto=".3f", color_continuous_scale="Blues", zmin=0, zmax=1, aspect="equal",
                    labels=dict(x="to stream", y="from stream", color="weight"),
                    x=[f"s{i}" for i in range(c.shape[1])], y=[f"s{i}" for i in range(c.shape[0])])
    fig.update_layout(height=330, margin=dict(l=10, r=10, t=30, b=10),
                      title=dict(text=f"{path} · {site} seam · position {pos}", font=dict(size=13)))
    return fig


def pre_post_figure(trace: Trace, path: str, site: str, row: int, pos: int) -> go.Figure:
    """`pre` mixes the 4 streams into the sublayer input; `post` spreads its output back over the streams."""
    rec = trace.fact("mhc", path, row, pos, site)
    if rec is None:
        raise KeyError(f"no mHC record for {path} {site} at row {row}, position {pos}")
    streams = [f"s{i}" for i in range(len(rec["pre"]))]
    fig = go.Figure()
    fig.add_bar(x=streams, y=rec["pre"], name="pre (read from stream)", marker_color="#3b6ea5")
    fig.add_bar(x=streams, y=rec["post"], name="post (written to stream)", marker_color="#c8741c")
    fig.update_layout(barmode="group", yaxis_title="weight")
    return titled(fig, f"pre and post weights · {path} · {site} seam", height=330)


def residual_table(trace: Trace, row: int = 0) -> pd.DataFrame:
    """Per seam: the largest Sinkhorn row and column residual over the row's tokens (0 = exactly doubly stochastic)."""
    acc: dict[tuple[str, str], list] = {}
    for p, s, r, _, v in trace.facts("mhc"):
        if r == row:
            acc.setdefault((p, s), []).append((float(v[3]), float(v[4])))
    rows = [{"seam": f"{p}.{s}", "layer": p, "site": s, "max row residual": max(a for a, _ in vals),
             "max column residual": max(b for _, b in vals), "tokens": len(vals)}
            for (p, s), vals in sorted(acc.items(), key=lambda kv: (path_order(kv[0][0]), kv[0][1]))]
    return pd.DataFrame(rows, columns=["seam", "layer", "site", "max row residual", "max column residual", "tokens"])


def residual_figure(trace: Trace, row: int = 0) -> go.Figure:
    t = residual_table(trace, row)
    fig = go.Figure()
    fig.add_scatter(x=t["seam"], y=t["max row residual"], mode="lines+markers", name="row sums − 1")
    fig.add_scatter(x=t["seam"], y=t["max column residual"], mode="lines+markers", name="column sums − 1")
    fig.update_layout(yaxis=dict(type="log", title="max |residual|"))
    return thinned_categories(titled(fig, "Sinkhorn residuals after the last iteration (max over tokens)", height=380),
                              list(t["seam"]), HALF_AXIS_LABELS)


def gain_by_depth(trace: Trace, row: int, pos: int) -> pd.DataFrame:
    """Max gain (largest absolute row or column sum) of C_1 @ ... @ C_n after each backbone seam.

    A product of doubly stochastic matrices stays doubly stochastic, so the gain stays 1; the mHC paper uses
    this measure to show that unconstrained hyper-connections blow up (gains in the thousands) while mHC
    keeps the residual path bounded. Rounding in Sinkhorn shows up as small drift above 1.
    """
    rows = [{"seam": f"{p}.{s}", "depth": depth, "gain": mhc_gain(product)}
            for depth, (p, s, product) in enumerate(trace.mhc_products(row, pos), start=1)]
    return pd.DataFrame(rows, columns=["seam", "depth", "gain"])


def gain_figure(trace: Trace, row: int, pos: int) -> go.Figure:
    t = gain_by_depth(trace, row, pos)
    fig = go.Figure(go.Scatter(x=t["seam"], y=t["gain"], mode="lines+markers", name="composite gain"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280", annotation_text="1 = no amplification")
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=30, b=10), yaxis_title="max gain of the product",
                      title=dict(text=f"composite mHC product over depth · position {pos}", font=dict(size=13)))
    return thinned_categories(fig, list(t["seam"]), HALF_AXIS_LABELS)
