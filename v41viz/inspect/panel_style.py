"""Shared figure layout for the Inspect panels: title top-left, legend in its own row above the plot, category axes
whose labels never overlap, and a categorical palette for ids."""
from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go

MAX_AXIS_LABELS = 24   # labels on a full-width category axis: upright, ≥ 16 px apart down to a 400 px plot
HALF_AXIS_LABELS = 10  # the same in a half-width column
# Kelly's 20 colours of maximum contrast (white and black left out), a set designed to tell many categories apart,
# then plotly's Alphabet for ids beyond 20 (a heatmap of ids also writes them in its cells and hover).
KELLY = ("#f3c300", "#875692", "#f38400", "#a1caf1", "#be0032", "#c2b280", "#848482", "#008856", "#e68fac",
         "#0067a5", "#f99379", "#604e97", "#f6a600", "#b3446c", "#dcd300", "#882d17", "#8db600", "#654522",
         "#e25822", "#2b3d26")
PALETTE = list(KELLY) + px.colors.qualitative.Alphabet
SELECTED = "#111827"   # the outline of the selected token's column


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


def width_thinned_categories(fig: go.Figure) -> go.Figure:
    """A category x axis with upright labels that plotly thins to the plot's drawn width (the chart's width is
    known only in the browser): plotly's automatic ticks on a category axis are 1.2 × the font size apart (13 px
    at 11 px), less than an upright label's line (15 px), so every second tick is labelled (≥ 26 px apart). For
    an axis of many categories with less room than a full-width chart (a colour bar beside it, 1000 px windows)."""
    fig.update_xaxes(type="category", tickangle=-90, automargin=True, tickmode="auto", tickvals=None, ticktext=None,
                     nticks=0, ticklabelstep=2, tickfont=dict(size=11))
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


def mark_token(fig: go.Figure, positions: list[int], pos: int | None) -> go.Figure:
    """Outline the selected token's column on a token × something heatmap (a category axis: column j spans
    j ± 0.5), so the token the slider, the table and the other charts show is visible here too."""
    if pos in positions:
        j = positions.index(pos)
        fig.add_shape(type="rect", xref="x", yref="paper", x0=j - 0.5, x1=j + 0.5, y0=0, y1=1, layer="above",
                      line=dict(color=SELECTED, width=2.5), fillcolor="rgba(0,0,0,0)")
    return fig


def clickable_cells(fig: go.Figure) -> go.Figure:
    """Make the first heatmap's cells clickable for Streamlit's plotly selection (on_select): plotly selects points
    of scatter-like traces only, never heatmap cells, so an invisible marker sits on every cell and carries the
    cell's hover (the heatmap's own hover is switched off, the two would compete). A selected point reports its
    cell's x and y category."""
    heat = fig.data[0]
    x, y, z = list(heat.x), list(heat.y), heat.z
    extra = heat.customdata
    points = [(i, j) for i in range(len(y)) for j in range(len(x))]
    template = (heat.hovertemplate or "%{y} · %{x}: %{z}<extra></extra>").replace("%{z", "%{customdata[0]") \
        .replace("%{customdata}", "%{customdata[1]}")
    fig.add_scatter(x=[x[j] for _, j in points], y=[y[i] for i, _ in points], mode="markers", showlegend=False,
                    customdata=[[_number(z[i][j]), extra[i][j] if extra is not None else ""] for i, j in points],
                    hovertemplate=template, marker=dict(size=14, opacity=0, symbol="square"),
                    selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)))
    heat.hoverinfo, heat.hovertemplate = "skip", None
    fig.update_layout(hoverdistance=-1)
    return fig


def _number(value) -> float | None:
    """A cell's z for the hover: NaN (not recorded) as None, which plotly writes empty."""
    value = float(value)
    return None if value != value else value
