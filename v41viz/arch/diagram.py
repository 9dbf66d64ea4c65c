"""Draw a Layout as a plotly figure: coloured boxes, flow arrows, residual and auxiliary paths, hover text."""
from __future__ import annotations

import plotly.graph_objects as go

from .box_text import fit_box_text
from .layout import Box, Layout

KIND_STYLE = {  # legend name, fill, border
    "attention": ("attention", "#dbe8f6", "#3b6ea5"),
    "ffn": ("FFN / MoE", "#fde6cf", "#c8741c"),
    "norm": ("norm / residual / layer", "#eceef1", "#6b7280"),
    "embedding": ("embedding / head", "#ecdff3", "#8a4fa8"),
    "auxiliary": ("auxiliary (Engram, DSpark, MTP)", "#d8f0e6", "#2f8a62"),
}
EDGE_STYLE = {  # legend name, colour, dash, width
    "flow": ("data flow", "#4b5563", "solid", 1.4),
    "residual": ("residual (mHC streams)", "#9ca3af", "dash", 1.4),
    "aux": ("auxiliary attachment", "#2f8a62", "dot", 1.4),
    "tap": ("DSpark tap", "#d97706", "dot", 1.8),
}
SELECTED = "#dc2626"
UNIT_PX = 46  # pixels per diagram unit, vertically


def build_figure(lay: Layout, selected: str = "", hover: dict[str, str] | None = None) -> go.Figure:
    """hover: node id → extra hover text (summary, sizes)."""
    hover = hover or {}
    fig = go.Figure()
    shapes, notes = [], []
    x0, y0, x1, y1 = lay.detail_frame
    if x1 > x0:
        shapes.append(dict(type="rect", x0=x0, y0=-y0, x1=x1, y1=-y1, line=dict(color="#cbd5e1", width=1, dash="dot"),
                           fillcolor="rgba(248,250,252,0.6)", layer="below"))
        notes.append(dict(x=x0 + 0.1, y=-y0 - 0.05, text=f"<b>{lay.detail_title}</b>", showarrow=False,
                          xanchor="left", yanchor="top", font=dict(size=12, color="#475569")))
        focus = lay.boxes.get(lay.focus_key)
        if focus:  # zoom lines from the focused stack box to the detail frame
            for fy in (y0, y1):
                shapes.append(dict(type="line", x0=focus.x + focus.w / 2, y0=-focus.y, x1=x0, y1=-fy,
                                   line=dict(color="#cbd5e1", width=1, dash="dot"), layer="below"))
    for e in lay.edges:
        shapes_e, notes_e = _edge(lay.boxes[e.a], lay.boxes[e.b], e.kind, e.label)
        shapes += shapes_e
        notes += notes_e
    for b in lay.boxes.values():
        _, fill, border = KIND_STYLE[b.kind]
        if b.stacked:
            for off in (0.16, 0.08):
                shapes.append(_rect(b, fill, border, dx=off, dy=off, width=1))
        sel = b.node == selected
        shapes.append(_rect(b, fill, SELECTED if sel else border, width=3 if sel else 1.3))
        text, size = fit_box_text(b.title, b.subtitle, b.w, b.h * UNIT_PX, 10 if b.dim else 11, 9.5, not b.dim)
        notes.append(dict(x=b.x, y=-b.y, text=text, showarrow=False, font=dict(size=size, color="#111827")))
        if b.badge:
            # just right of the card pile, so it covers no text of this row or the next
            notes.append(dict(x=b.x + b.w / 2 + 0.24, y=-b.y, text=f"<b>{b.badge}</b>", showarrow=False,
                              xanchor="left", yanchor="middle", bgcolor="#374151", font=dict(size=11, color="white"),
                              borderpad=2))
    _click_targets(fig, lay, hover)
    _legend(fig)
    xs = [b.x - b.w / 2 for b in lay.boxes.values()] + [b.x + b.w / 2 for b in lay.boxes.values()]
    fig.update_layout(
        shapes=shapes, annotations=notes, height=int(max(lay.height + 1.0, 8) * UNIT_PX),
        margin=dict(l=8, r=8, t=8, b=8), plot_bgcolor="white", paper_bgcolor="white",
        xaxis=dict(visible=False, range=[min(xs) - 0.3, max(xs) + 0.3], fixedrange=True),
        yaxis=dict(visible=False, range=[-(lay.height + 0.2), 0.8], fixedrange=True),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, font=dict(size=11)),
        hoverlabel=dict(bgcolor="white", font=dict(size=12)), dragmode=False, clickmode="event+select",
    )
    return fig


def _rect(b: Box, fill: str, border: str, dx: float = 0.0, dy: float = 0.0, width: float = 1.3) -> dict:
    return dict(type="rect", x0=b.x - b.w / 2 + dx, x1=b.x + b.w / 2 + dx, y0=-(b.y - b.h / 2) + dy,
                y1=-(b.y + b.h / 2) + dy, fillcolor=fill, line=dict(color=border, width=width), layer="below")


def _edge(a: Box, b: Box, kind: str, label: str) -> tuple[list, list]:
    _, colour, dash, width = EDGE_STYLE[kind]
    line = dict(color=colour, width=width, dash=dash)
    if kind == "residual":  # bracket on the left of the detail column, bypassing the sublayer
        xl = a.x - a.w / 2 - 0.25
        pts = [(a.x - a.w / 2, a.y), (xl, a.y), (xl, b.y), (b.x - b.w / 2, b.y)]
        shapes = [dict(type="line", x0=p[0], y0=-p[1], x1=q[0], y1=-q[1], line=line, layer="below")
                  for p, q in zip(pts, pts[1:])]
        return shapes, []
    if abs(a.x - b.x) < 1e-6:  # vertical: bottom of a to top of b, with an arrow head
        start, end = (a.x, a.y + a.h / 2), (b.x, b.y - b.h / 2)
    elif a.x < b.x:
        start, end = (a.x + a.w / 2, a.y), (b.x - b.w / 2, b.y)
    else:
        start, end = (a.x - a.w / 2, a.y), (b.x + b.w / 2, b.y)
    if kind == "aux" and abs(a.y - b.y) > 2 and abs(a.x - b.x) > 1e-6:  # long link: route along the top
        start, end = (a.x - a.w / 2, a.y), (b.x, b.y - b.h / 2)
    note = dict(x=end[0], y=-end[1], ax=start[0], ay=-start[1], xref="x", yref="y", axref="x", ayref="y",
                showarrow=True, arrowhead=2 if kind in ("flow", "tap") else 0, arrowsize=1, arrowwidth=width,
                arrowcolor=colour, text="", standoff=1)
    shapes = [] if dash == "solid" else [dict(type="line", x0=start[0], y0=-start[1], x1=end[0], y1=-end[1],
                                              line=line, layer="below")]
    if dash != "solid":
        note["arrowcolor"] = "rgba(0,0,0,0)" if kind == "aux" else colour
        note["arrowwidth"] = width
    return shapes, [note]


def _click_targets(fig: go.Figure, lay: Layout, hover: dict[str, str]) -> None:
    """Invisible markers spread over each box: hovering shows the summary, clicking selects the node."""
    xs, ys, ids, texts = [], [], [], []
    for b in lay.boxes.values():
        n = max(2, int(b.w / 0.3))
        for i in range(n):
            xs.append(b.x - b.w / 2 + (i + 0.5) * b.w / n)
            ys.append(-b.y)
            ids.append(b.node)
            texts.append(f"<b>{b.node}</b><br>{hover.get(b.node, b.subtitle)}")
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", customdata=ids, hovertext=texts, hoverinfo="text", showlegend=False,
        marker=dict(size=22, symbol="square", color="rgba(0,0,0,0)"), name="modules",
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0))))


def _legend(fig: go.Figure) -> None:
    for name, fill, border in KIND_STYLE.values():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                 marker=dict(size=13, symbol="square", color=fill, line=dict(color=border, width=1.5))))
    for name, colour, dash, width in EDGE_STYLE.values():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, hoverinfo="skip",
                                 line=dict(color=colour, dash=dash, width=width)))
