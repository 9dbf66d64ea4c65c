"""Draw a Layout as SVG with an HTML legend: coloured boxes, flow arrows, residual and auxiliary paths, hover text.

Each box is a group carrying its graph node (data-node) and hover text (data-tip), which the page's diagram
component turns into selections and tooltips. Every text is escaped: labels can come from an uploaded config."""
from __future__ import annotations

from html import escape

from .box_text import LINE_HEIGHT, PX_X, PX_Y, Line, fit_box_text, lines_height, text_px
from .layout import Box, Layout

KIND_STYLE = {  # legend name, fill, border
    "attention": ("attention", "#dbe8f6", "#3b6ea5"),
    "ffn": ("FFN / MoE", "#fde6cf", "#c8741c"),
    "norm": ("norm / residual / layer", "#eceef1", "#6b7280"),
    "embedding": ("embedding / head", "#ecdff3", "#8a4fa8"),
    "auxiliary": ("auxiliary (Engram, DSpark, MTP)", "#d8f0e6", "#2f8a62"),
}
EDGE_STYLE = {  # legend name, colour, dash pattern ("" = solid), width
    "flow": ("data flow", "#4b5563", "", 1.4),
    "residual": ("residual (mHC streams)", "#9ca3af", "5 3", 1.4),
    "aux": ("auxiliary attachment", "#2f8a62", "1.5 2.5", 1.4),
    "tap": ("DSpark tap", "#d97706", "1.5 2.5", 1.8),
}
ARROWED = ("flow", "tap")
MARGIN = 0.3            # diagram units around the drawing
STACK_OFFSETS = ((0.16, 0.08), (0.08, 0.04))   # the cards behind a folded group: right and up, in units
BADGE_GAP, BADGE_SIZE = 0.24, 11.0


class Canvas:
    """Diagram units → design pixels (y grows downwards in both)."""

    def __init__(self, lay: Layout):
        boxes = list(lay.boxes.values())
        lefts = [b.x - b.w / 2 for b in boxes]
        rights = [b.x + b.w / 2 + (0.2 if b.stacked else 0) for b in boxes]
        rights += [b.x + b.w / 2 + BADGE_GAP + (text_px(b.badge, BADGE_SIZE, True) + 8) / PX_X
                   for b in boxes if b.badge]
        tops = [b.y - b.h / 2 - (0.1 if b.stacked else 0) for b in boxes]
        bottoms = [b.y + b.h / 2 for b in boxes]
        x0, y0, x1, y1 = lay.detail_frame
        if x1 > x0:
            lefts, rights, tops, bottoms = lefts + [x0], rights + [x1], tops + [y0], bottoms + [y1]
        lefts.append(min(lefts) - 0.25)   # room for the residual bracket left of the detail column
        self.x_min, self.y_min = min(lefts) - MARGIN, min(tops) - MARGIN
        self.width = round((max(rights) + MARGIN - self.x_min) * PX_X)
        self.height = round((max(bottoms) + MARGIN - self.y_min) * PX_Y)

    def x(self, units: float) -> float:
        return round((units - self.x_min) * PX_X, 1)

    def y(self, units: float) -> float:
        return round((units - self.y_min) * PX_Y, 1)


def diagram_html(lay: Layout, selected: str = "", hover: dict[str, str] | None = None) -> str:
    """The legend and the SVG drawing; hover: node id → its hover text (summary, sizes), lines split by newlines."""
    hover = hover or {}
    c = Canvas(lay)
    parts = [_markers()]
    x0, y0, x1, y1 = lay.detail_frame
    if x1 > x0:
        parts.append(_rect(c, x0, y0, x1, y1, "rgba(248,250,252,0.6)", "#cbd5e1", 1, dash="1.5 2.5"))
        focus = lay.boxes.get(lay.focus_key)
        if focus:  # zoom lines from the focused stack box to the detail frame
            parts += [_line(c, [(focus.x + focus.w / 2, focus.y), (x0, fy)], "#cbd5e1", 1, "1.5 2.5")
                      for fy in (y0, y1)]
        parts.append(f'<text class="v41-frame-title" x="{c.x(x0 + 0.1)}" y="{c.y(y0 + 0.08)}" '
                     f'dominant-baseline="hanging" font-size="12" font-weight="bold" fill="#475569">'
                     f'{escape(lay.detail_title)}</text>')
    parts += [_edge(c, lay.boxes[e.a], lay.boxes[e.b], e.kind) for e in lay.edges]
    parts += [_box(c, b, b.node == selected, hover.get(b.node, b.subtitle)) for b in lay.boxes.values()]
    svg = (f'<svg class="v41-diagram" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {c.width} {c.height}" '
           f'width="{c.width}" height="{c.height}" style="max-width:{round(c.width * 1.25)}px" role="group" '
           f'aria-label="architecture diagram">{"".join(parts)}</svg>')
    return legend_html() + svg


def legend_html() -> str:
    items = []
    for name, fill, border in KIND_STYLE.values():
        swatch = f'<rect x="1" y="1" width="12" height="12" fill="{fill}" stroke="{border}" stroke-width="1.5"/>'
        items.append((swatch, name))
    for kind, (name, colour, dash, width) in EDGE_STYLE.items():
        swatch = (f'<line x1="0" y1="7" x2="26" y2="7" stroke="{colour}" stroke-width="{width}"'
                  + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        items.append((swatch, name))
    return '<div class="v41-legend">' + "".join(
        f'<span><svg width="{26 if "line" in s else 14}" height="14">{s}</svg>{escape(n)}</span>' for s, n in items
    ) + "</div>"


def _markers() -> str:
    return "<defs>" + "".join(
        f'<marker id="v41-arrow-{kind}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE_STYLE[kind][1]}"/></marker>'
        for kind in ARROWED) + "</defs>"


def _rect(c: Canvas, x0: float, y0: float, x1: float, y1: float, fill: str, stroke: str, width: float,
          dash: str = "", cls: str = "") -> str:
    cls_attr = f' class="{cls}"' if cls else ""
    return (f'<rect{cls_attr} x="{c.x(x0)}" y="{c.y(y0)}" '
            f'width="{round((x1 - x0) * PX_X, 1)}" height="{round((y1 - y0) * PX_Y, 1)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{width}"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")


def _line(c: Canvas, points: list[tuple[float, float]], colour: str, width: float, dash: str = "",
          arrow: str = "") -> str:
    pts = " ".join(f"{c.x(x)},{c.y(y)}" for x, y in points)
    return (f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="{width}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + (f' marker-end="url(#v41-arrow-{arrow})"' if arrow else "") + "/>")


def _edge(c: Canvas, a: Box, b: Box, kind: str) -> str:
    _, colour, dash, width = EDGE_STYLE[kind]
    if kind == "residual":  # bracket on the left of the detail column, bypassing the sublayer
        xl = a.x - a.w / 2 - 0.25
        return _line(c, [(a.x - a.w / 2, a.y), (xl, a.y), (xl, b.y), (b.x - b.w / 2, b.y)], colour, width, dash)
    if abs(a.x - b.x) < 1e-6:  # vertical: bottom of a to top of b
        start, end = (a.x, a.y + a.h / 2), (b.x, b.y - b.h / 2)
    elif a.x < b.x:
        start, end = (a.x + a.w / 2, a.y), (b.x - b.w / 2, b.y)
    else:
        start, end = (a.x - a.w / 2, a.y), (b.x + b.w / 2, b.y)
    if kind == "aux" and abs(a.y - b.y) > 2 and abs(a.x - b.x) > 1e-6:  # long link: route along the top
        start, end = (a.x - a.w / 2, a.y), (b.x, b.y - b.h / 2)
    return _line(c, [start, end], colour, width, dash, kind if kind in ARROWED else "")


def _box(c: Canvas, b: Box, selected: bool, hover: str) -> str:
    _, fill, border = KIND_STYLE[b.kind]
    left, top, right, bottom = b.x - b.w / 2, b.y - b.h / 2, b.x + b.w / 2, b.y + b.h / 2
    cards = [_rect(c, left + dx, top - dy, right + dx, bottom - dy, fill, border, 1) for dx, dy in STACK_OFFSETS
             ] if b.stacked else []
    card = _rect(c, left, top, right, bottom, fill, border, 1.3, cls="v41-card")
    lines = fit_box_text(b.title, b.subtitle, b.w, b.h, 10 if b.dim else 11, 9.5, not b.dim)
    texts = _text_lines(c, b, lines)
    badge = ""
    if b.badge:  # just right of the card pile, so it covers no text of this row or the next
        bx, w = c.x(right + BADGE_GAP), text_px(b.badge, BADGE_SIZE, True) + 8
        badge = (f'<rect class="v41-badge" x="{bx}" y="{round(c.y(b.y) - 9, 1)}" width="{round(w, 1)}" height="18" '
                 f'rx="2" fill="#374151"/><text class="v41-badge" x="{round(bx + w / 2, 1)}" y="{c.y(b.y)}" '
                 f'text-anchor="middle" '
                 f'dominant-baseline="central" font-size="{BADGE_SIZE}" font-weight="bold" fill="white">'
                 f'{escape(b.badge)}</text>')
    tip = escape(f"{b.node}\n{hover}", quote=True).replace("\n", "&#10;")   # line breaks survive in an attribute
    label = escape(f"{b.node}: {b.title}", quote=True)
    return (f'<g class="v41-box{" v41-selected" if selected else ""}" data-node="{escape(b.node, quote=True)}" '
            f'data-tip="{tip}" tabindex="0" role="button" aria-label="{label}">'
            + "".join(cards) + card + texts + badge + "</g>")


def _text_lines(c: Canvas, b: Box, lines: list[Line]) -> str:
    y = c.y(b.y) - lines_height(lines) / 2
    out = []
    for line in lines:
        pitch = line.size * LINE_HEIGHT
        out.append(f'<text x="{c.x(b.x)}" y="{round(y + pitch / 2, 1)}" text-anchor="middle" '
                   f'dominant-baseline="central" font-size="{line.size:.1f}"'
                   + (' font-weight="bold"' if line.bold else "")
                   + f' fill="{"#4b5563" if line.muted else "#111827"}">{escape(line.text)}</text>')
        y += pitch
    return "".join(out)
