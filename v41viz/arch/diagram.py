"""Draw a Layout as SVG with an HTML legend: coloured boxes, flow arrows labelled with their shapes, residual and
auxiliary paths, opened boxes holding their steps, hover text.

Each box is a group carrying its module path (data-node, the box's stable id) and hover text (data-tip), which the
page's diagram component turns into selections and tooltips; painting (paint.py) finds boxes by data-node. Every
text is escaped: labels can come from an uploaded config. The SVG is self-contained (presentation attributes, a
generic font) so that the component can export it as it is."""
from __future__ import annotations

from html import escape

from .box_text import LINE_HEIGHT, PX_X, PX_Y, Line, fit_box_text, lines_height, text_px
from .boxes import Box, Layout
from .labels import LABEL_SIZE, Label, place_labels
from .legend import EDGE_STYLE, KIND_STYLE, legend_html, legend_svg
from .routes import edge_points

__all__ = ["KIND_STYLE", "EDGE_STYLE", "Canvas", "diagram_html", "legend_html"]
ARROWED = ("flow", "tap")
MARGIN = 0.3            # diagram units around the drawing
STACK_OFFSETS = ((0.16, 0.08), (0.08, 0.04))   # the cards behind a folded group: right and up, in units
BADGE_GAP, BADGE_SIZE = 0.24, 11.0
FONT_FAMILY = "Helvetica, Arial, sans-serif"   # the page's CSS sets its own font; an export keeps this generic one
TOGGLE = 13.0           # px: the open / close control of an openable box


class Canvas:
    """Diagram units → design pixels (y grows downwards in both)."""

    def __init__(self, lay: Layout, extra: list[tuple[float, float, float, float]] = ()):
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
        for ex0, ey0, ex1, ey1 in extra:     # arrow ends and labels outside every box
            lefts, rights, tops, bottoms = lefts + [ex0], rights + [ex1], tops + [ey0], bottoms + [ey1]
        lefts.append(min(lefts) - 0.25)   # room for the residual bracket left of the detail column
        self.x_min, self.y_min = min(lefts) - MARGIN, min(tops) - MARGIN
        self.width = round((max(rights) + MARGIN - self.x_min) * PX_X)
        self.height = round((max(bottoms) + MARGIN - self.y_min) * PX_Y)

    def x(self, units: float) -> float:
        return round((units - self.x_min) * PX_X, 1)

    def y(self, units: float) -> float:
        return round((units - self.y_min) * PX_Y, 1)


def diagram_html(lay: Layout, selected: str = "", hover: dict[str, str] | None = None, name: str = "") -> str:
    """The legend and the SVG drawing; hover: node id → its hover text (summary, sizes), lines split by newlines;
    name: the model's name, the title of an exported picture."""
    hover = hover or {}
    paths = [edge_points(lay, e) for e in lay.edges]
    labels, _ = place_labels(lay, paths)
    extra = [(min(x for x, _ in p), min(y for _, y in p), max(x for x, _ in p), max(y for _, y in p)) for p in paths]
    c = Canvas(lay, extra + [lab.rect for lab in labels])
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
    containers = [b for b in lay.boxes.values() if b.container]
    parts += [_box(c, b, b.node == selected, hover.get(b.node, b.subtitle)) for b in containers]
    parts += [_edge(c, e.kind, pts) for e, pts in zip(lay.edges, paths)]
    parts += [_label(c, lab) for lab in labels]
    parts += [_box(c, b, b.node == selected, hover.get(b.node, b.subtitle)) for b in lay.boxes.values()
              if not b.container]
    xlegend, legend_h = legend_svg(c.width, title=name)
    svg = (f'<svg class="v41-diagram" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {c.width} {c.height}" '
           f'width="{c.width}" height="{c.height}" font-family="{FONT_FAMILY}" data-legend-h="{round(legend_h, 1)}" '
           f'data-name="{escape(name, quote=True)}" role="group" aria-label="architecture diagram">'
           f'{xlegend}{"".join(parts)}</svg>')
    return legend_html() + svg


def _markers() -> str:
    return "<defs>" + "".join(
        f'<marker id="v41-arrow-{kind}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE_STYLE[kind][1]}"/></marker>'
        for kind in ARROWED) + "</defs>"


def _rect(c: Canvas, x0: float, y0: float, x1: float, y1: float, fill: str, stroke: str, width: float,
          dash: str = "", cls: str = "", rx: float = 0, opacity: float = 1.0) -> str:
    cls_attr = f' class="{cls}"' if cls else ""
    return (f'<rect{cls_attr} x="{c.x(x0)}" y="{c.y(y0)}" '
            f'width="{round((x1 - x0) * PX_X, 1)}" height="{round((y1 - y0) * PX_Y, 1)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{width}"' + (f' stroke-dasharray="{dash}"' if dash else "")
            + (f' rx="{rx}"' if rx else "") + (f' fill-opacity="{opacity}"' if opacity < 1 else "") + "/>")


def _line(c: Canvas, points: list[tuple[float, float]], colour: str, width: float, dash: str = "",
          arrow: str = "") -> str:
    pts = " ".join(f"{c.x(x)},{c.y(y)}" for x, y in points)
    return (f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="{width}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + (f' marker-end="url(#v41-arrow-{arrow})"' if arrow else "") + "/>")


def _edge(c: Canvas, kind: str, points: list[tuple[float, float]]) -> str:
    _, colour, dash, width = EDGE_STYLE[kind]
    return _line(c, points, colour, width, dash, kind if kind in ARROWED else "")


def _label(c: Canvas, lab: Label) -> str:
    """A shape label: grey, with a white halo so that a line behind it does not cut through the text."""
    return (f'<text class="v41-shape" x="{c.x(lab.x)}" y="{c.y(lab.y)}" text-anchor="{lab.anchor}" '
            f'dominant-baseline="central" font-size="{LABEL_SIZE}" fill="#4b5563" stroke="white" stroke-width="3" '
            f'stroke-linejoin="round" paint-order="stroke">{escape(lab.text)}</text>')


def _box(c: Canvas, b: Box, selected: bool, hover: str) -> str:
    _, fill, border = KIND_STYLE[b.kind]
    left, top, right, bottom = b.left, b.top, b.right, b.bottom
    if b.container:   # an opened box: a pale frame, its title in the top row, the steps drawn over it
        card = _rect(c, left, top, right, bottom, fill, border, 1.3, cls="v41-card", rx=4, opacity=0.35)
        texts = _title_row(c, b)
    else:
        cards = [_rect(c, left + dx, top - dy, right + dx, bottom - dy, fill, border, 1) for dx, dy in STACK_OFFSETS
                 ] if b.stacked else []
        card = "".join(cards) + _rect(c, left, top, right, bottom, fill, border, 1.3, dash="4 2.5" if b.dashed else "",
                                      cls="v41-card")
        lines = fit_box_text(b.title, b.subtitle, b.w - (TOGGLE + 6) / PX_X if b.toggle else b.w, b.h,
                             10 if b.dim else 11, 9.5, not b.dim)
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
    covers = f' data-covers="{escape(" ".join(b.covers), quote=True)}"' if b.covers else ""
    opens = f' data-opens="{b.toggle}"' if b.toggle and not b.container else ""
    return (f'<g class="v41-box{" v41-selected" if selected else ""}{" v41-open" if b.container else ""}" '
            f'data-node="{escape(b.node, quote=True)}" data-key="{escape(b.key, quote=True)}"{covers}{opens} '
            f'data-tip="{tip}" tabindex="0" role="button" aria-label="{label}">'
            + card + texts + badge + (_toggle(c, b) if b.toggle else "") + "</g>")


def _title_row(c: Canvas, b: Box) -> str:
    """An opened box's title and size on one line at its top left."""
    x, y = c.x(b.left + 0.15), c.y(b.top + 0.26)
    sub = (f'<tspan fill="#4b5563" font-weight="normal" font-size="9.5">  {escape(b.subtitle)}</tspan>'
           if b.subtitle else "")
    return (f'<text x="{x}" y="{y}" dominant-baseline="central" font-size="11" font-weight="bold" fill="#111827">'
            f'{escape(b.title)}{sub}</text>')


def _toggle(c: Canvas, b: Box) -> str:
    """The open (+) / close (−) control in the box's top right corner: a button of its own (data-toggle), so that
    a click on it opens or closes the box without selecting it."""
    x, y = round(c.x(b.right) - TOGGLE - 4, 1), round(c.y(b.top) + 4, 1)
    mid_x, mid_y, arm = round(x + TOGGLE / 2, 1), round(y + TOGGLE / 2, 1), 3.5
    plus = "" if b.container else f" M{mid_x},{round(mid_y - arm, 1)} V{round(mid_y + arm, 1)}"
    what = ("close" if b.container else "open") + (" the attention steps" if b.toggle == "attn" else " the MoE steps")
    return (f'<rect class="v41-toggle" data-toggle="{b.toggle}" x="{x}" y="{y}" width="{TOGGLE}" height="{TOGGLE}" '
            f'rx="3" fill="white" stroke="#6b7280" stroke-width="1" role="button" tabindex="0" '
            f'aria-label="{what}"><title>{what}</title></rect>'
            f'<path d="M{round(mid_x - arm, 1)},{mid_y} H{round(mid_x + arm, 1)}{plus}" stroke="#374151" '
            f'stroke-width="1.6" pointer-events="none"/>')


def _text_lines(c: Canvas, b: Box, lines: list[Line]) -> str:
    y = c.y(b.y) - lines_height(lines) / 2
    out = []
    shift = -(TOGGLE + 6) / 2 if b.toggle else 0.0   # clear of the open control on the right
    for line in lines:
        pitch = line.size * LINE_HEIGHT
        out.append(f'<text x="{round(c.x(b.x) + shift, 1)}" y="{round(y + pitch / 2, 1)}" text-anchor="middle" '
                   f'dominant-baseline="central" font-size="{line.size:.1f}"'
                   + (' font-weight="bold"' if line.bold else "")
                   + f' fill="{"#4b5563" if line.muted else "#111827"}">{escape(line.text)}</text>')
        y += pitch
    return "".join(out)
