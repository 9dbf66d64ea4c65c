"""Paint live values onto a drawn diagram: fill named boxes with a colour, show each one's value, add a legend.

The hook the live overlays use (issue 20, item 2): it works on diagram_html's output, so a cached drawing is
repainted for another token without laying it out again. Boxes are found by their module path (data-node)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape, unescape

from .box_text import text_px
from .legend import Item, legend_html, legend_svg

BOX = re.compile(r'(<g class="v41-box[^"]*" data-node="(?P<node>[^"]*)"[^>]*>)(?P<body>.*?)(</g>)', re.S)
CARD = re.compile(r'<rect class="v41-card" x="(?P<x>[\d.]+)" y="(?P<y>[\d.]+)" width="(?P<w>[\d.]+)" '
                  r'height="(?P<h>[\d.]+)" fill="[^"]*"')
TIP = re.compile(r'data-tip="([^"]*)"')
SVG_OPEN = re.compile(r'<svg class="v41-diagram"[^>]*>')
LINE = re.compile(r'<text x="(?P<x>[\d.]+)" y="(?P<y>[\d.]+)" text-anchor="middle" dominant-baseline="central" '
                  r'font-size="(?P<size>[\d.]+)"(?P<bold> font-weight="bold")? fill="(?P<fill>[^"]*)">'
                  r'(?P<text>.*?)</text>')
MUTED = "#4b5563"        # a subtitle line's colour (diagram._text_lines)
VALUE_SIZE = 8.5
TOGGLE_ROOM = 19.0       # px the open / close control takes in a box's top right corner
# While painted, the boxes without a value fade, so that the eye finds the painted ones (kept in an export too).
FADE = ('<style>[data-painting] .v41-box:not(.v41-painted):not(.v41-open):not(.v41-selected) > .v41-card '
        '{fill-opacity: 0.35; stroke-opacity: 0.45}</style>')


def paint_svg(html: str, fills: Mapping[str, tuple[str, str]], legend: Sequence[tuple[str, str]] = (),
              title: str = "") -> tuple[str, list[str]]:
    """html: diagram_html's output; fills: box id (module path) → (fill colour, value text); legend: (colour,
    label) swatches under `title`. Returns the painted html and the ids of fills that no drawn box carries (a layer
    folded into a group, a module of another layer than the focused one)."""
    found = set()

    def paint_box(m: re.Match) -> str:
        node = unescape(m["node"])
        if node not in fills:
            return m[0]
        found.add(node)
        colour, value = fills[node]
        head, body = m[1], m["body"]
        card = CARD.search(body)
        if card is None:
            return m[0]
        body = body[:card.start()] + card[0].rsplit('fill="', 1)[0] + f'fill="{escape(colour, quote=True)}"' \
            + body[card.end():]
        head = TIP.sub(lambda t: f'data-tip="{t[1]}&#10;{escape(title or "value", quote=True)}: '
                                 f'{escape(value, quote=True)}"', head, count=1)
        head = head.replace('class="v41-box', 'class="v41-box v41-painted', 1)
        body, pill = _value(card, body, value)
        return head + body + pill + m[4]

    painted = BOX.sub(paint_box, html)
    if legend or title:
        painted = _add_legend(painted, legend, title)
    if found:
        painted = SVG_OPEN.sub(lambda m: m[0][:-1] + ' data-painting="1">' + FADE, painted, count=1)
    return painted, sorted(set(fills) - found)


def _value(card: re.Match, body: str, value: str) -> tuple[str, str]:
    """The value in a white pill: in the card's top right corner (left of an open / close control), the title moved
    left out of its way; where the card has no room for that, the value takes the subtitle's place at the card's
    foot instead (the subtitle stays in the hover text and the details)."""
    if not value:
        return body, ""
    cx, cy, cw, ch = (float(card[k]) for k in "xywh")
    w = text_px(value, VALUE_SIZE, True) + 8
    x, y = cx + cw - w - 2 - (TOGGLE_ROOM if 'class="v41-toggle"' in body else 0), cy + 2
    moved = [_clear_of(t, x, y, cx) for t in LINE.finditer(body)]
    if None not in moved:
        for line, text in zip(reversed(list(LINE.finditer(body))), reversed(moved)):
            body = body[:line.start()] + text + body[line.end():]
    else:
        body = LINE.sub(lambda t: "" if t["fill"] == MUTED else t[0], body)
        x, y = cx + (cw - w) / 2, cy + ch - 13
    return body, (f'<rect class="v41-value" x="{round(x, 1)}" y="{round(y, 1)}" width="{round(w, 1)}" height="11" '
                  f'rx="2" fill="white" fill-opacity="0.85"/><text class="v41-value" x="{round(x + w / 2, 1)}" '
                  f'y="{round(y + 5.5, 1)}" text-anchor="middle" dominant-baseline="central" font-size="{VALUE_SIZE}" '
                  f'font-weight="bold" fill="#111827">{escape(value)}</text>')


def _clear_of(line: re.Match, pill_x: float, pill_y: float, card_x: float) -> str | None:
    """A text line moved left so that it ends before the pill when it shares the pill's height; None when the card
    has no room for that."""
    size, x, y = float(line["size"]), float(line["x"]), float(line["y"])
    if abs(y - (pill_y + 5.5)) >= 5.5 + size * 0.6:
        return line[0]
    half = text_px(unescape(line["text"]), size, bool(line["bold"])) / 2
    shift = x + half - (pill_x - 2)
    if shift <= 0:
        return line[0]
    if x - shift - half < card_x + 3:
        return None
    return line[0].replace(f'x="{line["x"]}"', f'x="{round(x - shift, 1)}"', 1)


def _add_legend(html: str, legend: Sequence[tuple[str, str]], title: str) -> str:
    """The paint legend under the diagram legend in the page, and above the drawing in an export."""
    items = [Item(label, fill=colour, border="#374151") for colour, label in legend]
    div = legend_html(([Item(title)] if title else []) + items, cls="v41-legend v41-paint-legend")
    svg_open = SVG_OPEN.search(html)
    if svg_open is None:
        return html
    tag = svg_open[0]
    width = float(re.search(r' width="([\d.]+)"', tag)[1])
    above = float(re.search(r'data-legend-h="([\d.]+)"', tag)[1])
    xlegend, h = legend_svg(width, items, top=above, title=title)
    tag = re.sub(r'data-legend-h="[\d.]+"', f'data-legend-h="{round(above + h, 1)}"', tag)
    return html[:svg_open.start()] + div + tag + xlegend + html[svg_open.end():]
