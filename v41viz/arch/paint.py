"""Paint live values onto a drawn diagram: fill named boxes with a colour, show each one's value, add a legend.

The hook the live overlays use (issue 20, item 2): it works on diagram_html's output, so a cached drawing is
repainted for another token without laying it out again. Boxes are found by their module path (data-node)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape, unescape

from .legend import Item, legend_html, legend_svg

BOX = re.compile(r'(<g class="v41-box[^"]*" data-node="(?P<node>[^"]*)"[^>]*>)(?P<body>.*?)(</g>)', re.S)
CARD = re.compile(r'<rect class="v41-card" x="(?P<x>[\d.]+)" y="(?P<y>[\d.]+)" width="(?P<w>[\d.]+)" '
                  r'height="(?P<h>[\d.]+)" fill="[^"]*"')
TIP = re.compile(r'data-tip="([^"]*)"')
SVG_OPEN = re.compile(r'<svg class="v41-diagram"[^>]*>')
VALUE_SIZE = 8.5


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
        return head + body + _value(card, value) + m[4]

    painted = BOX.sub(paint_box, html)
    if legend or title:
        painted = _add_legend(painted, legend, title)
    return painted, sorted(set(fills) - found)


def _value(card: re.Match, value: str) -> str:
    """The value in a white pill inside the card's top right corner."""
    if not value:
        return ""
    w = len(value) * VALUE_SIZE * 0.55 + 6
    x = float(card["x"]) + float(card["w"]) - w - 2
    y = float(card["y"]) + 2
    return (f'<rect class="v41-value" x="{round(x, 1)}" y="{round(y, 1)}" width="{round(w, 1)}" height="11" rx="2" '
            f'fill="white" fill-opacity="0.85"/><text class="v41-value" x="{round(x + w / 2, 1)}" '
            f'y="{round(y + 5.5, 1)}" text-anchor="middle" dominant-baseline="central" font-size="{VALUE_SIZE}" '
            f'font-weight="bold" fill="#111827">{escape(value)}</text>')


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
