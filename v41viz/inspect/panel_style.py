"""Shared figure layout for the Inspect panels: title top-left, legend in its own row above the plot, category axes
whose labels never overlap, and a categorical palette for ids."""
from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go

MAX_AXIS_LABELS = 24   # labels on a full-width category axis: upright, ≥ 16 px apart down to a 400 px plot
HALF_AXIS_LABELS = 10  # the same in a half-width column
PALETTE = px.colors.qualitative.Alphabet + px.colors.qualitative.Dark24


def titled(fig: go.Figure, title: str | None, height: int = 300, legend: bool = True) -> go.Figure:
    """Give a figure its title and keep the legend from overlapping it (title row, then legend row)."""
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=78 if legend else 36, b=10),
                      title=dict(text=title or "", font=dict(size=13), x=0.01, xanchor="left", y=0.985,
                                 yanchor="top", yref="container"))
    if legend:
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom"))
    return fig


def thinned_categories(fig: go.Figure, categories: list[str], max_labels: int = MAX_AXIS_LABELS,
                       upright: bool = True) -> go.Figure:
    """A category x axis with labels turned upright (or level, for short ones) and thinned to at most max_labels
    evenly spaced ones (the hover still names every category), so that labels never collide however many
    tokens, seams or experts there are."""
    step = max(1, -(-len(categories) // max_labels))
    shown = categories[::step]
    fig.update_xaxes(type="category", tickangle=-90 if upright else 0, automargin=True, tickmode="array",
                     tickvals=shown, ticktext=shown, tickfont=dict(size=11))
    return fig


def categorical_scale(n: int) -> list[list]:
    """A stepped colour scale over ids 0..n-1 (for zmin=-0.5, zmax=n-0.5): one flat palette colour per id, so
    neighbouring ids look as different as distant ones (ids are categories, not amounts)."""
    n = max(n, 1)
    scale = []
    for i in range(n):
        colour = PALETTE[i % len(PALETTE)]
        scale += [[i / n, colour], [(i + 1) / n, colour]]
    return scale


def ratio_scale(top: float) -> list[list]:
    """Blue below 1, white at 1, red above, over [0, top] (a ratio to the uniform share: never below 0)."""
    mid = 1.0 / top if top > 1.0 else 0.5
    return [[0.0, "#2166ac"], [mid / 2, "#92c5de"], [mid, "#f7f7f7"], [mid + (1 - mid) / 2, "#f4a582"],
            [1.0, "#b2182b"]]
