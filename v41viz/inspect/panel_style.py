"""Shared figure layout for the Inspect panels: title top-left, legend in its own row above the plot."""
from __future__ import annotations

import plotly.graph_objects as go


def titled(fig: go.Figure, title: str | None, height: int = 300, legend: bool = True) -> go.Figure:
    """Give a figure its title and keep the legend from overlapping it (title row, then legend row)."""
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=78 if legend else 36, b=10),
                      title=dict(text=title or "", font=dict(size=13), x=0.01, xanchor="left", y=0.985,
                                 yanchor="top", yref="container"))
    if legend:
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom"))
    return fig
