"""The diagram's legend: box colours, arrow styles and the shape symbols, as HTML above the live drawing and as SVG
above an exported one (hidden in the page: the export shows it)."""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from .box_text import text_px
from .shapes import SYMBOLS

KIND_STYLE = {  # legend name, fill, border
    "attention": ("attention", "#dbe8f6", "#3b6ea5"),
    "ffn": ("FFN / MoE", "#fde6cf", "#c8741c"),
    "norm": ("norm / residual / layer", "#eceef1", "#6b7280"),
    "embedding": ("embedding / head", "#ecdff3", "#8a4fa8"),
    "auxiliary": ("auxiliary (Engram, DSpark, MTP)", "#d8f0e6", "#2f8a62"),
}
EDGE_STYLE = {  # legend name, colour, dash pattern ("" = solid), width
    "flow": ("data flow (label: the shape it carries)", "#4b5563", "", 1.4),
    "residual": ("residual (mHC streams)", "#9ca3af", "5 3", 1.4),
    "aux": ("auxiliary attachment", "#2f8a62", "1.5 2.5", 1.4),
    "tap": ("DSpark tap", "#d97706", "1.5 2.5", 1.8),
}
FONT = 12.0
ROW_H = 18.0


@dataclass(frozen=True)
class Item:
    name: str
    fill: str = ""       # a box swatch: fill and border
    border: str = ""
    line: str = ""       # a line swatch: colour, dash, width
    dash: str = ""
    width: float = 0.0

    @property
    def swatch_w(self) -> float:
        return 26 if self.line else 14 if self.fill else 0

    def swatch(self, x: float, y: float) -> str:
        """The swatch's SVG elements with its top-left corner at (x, y)."""
        if self.line:
            return (f'<line x1="{x}" y1="{y + 7}" x2="{x + 26}" y2="{y + 7}" stroke="{self.line}" '
                    f'stroke-width="{self.width}"' + (f' stroke-dasharray="{self.dash}"' if self.dash else "") + "/>")
        if self.fill:
            return (f'<rect x="{x + 1}" y="{y + 1}" width="12" height="12" fill="{escape(self.fill, quote=True)}" '
                    f'stroke="{escape(self.border, quote=True)}" stroke-width="1.5"/>')
        return ""


def diagram_items() -> list[Item]:
    items = [Item(name, fill=fill, border=border) for name, fill, border in KIND_STYLE.values()]
    items += [Item(name, line=colour, dash=dash, width=width) for name, colour, dash, width in EDGE_STYLE.values()]
    return items + [Item(SYMBOLS)]


def legend_html(items: list[Item] | None = None, cls: str = "v41-legend") -> str:
    items = diagram_items() if items is None else items
    spans = []
    for it in items:
        sw = f'<svg width="{it.swatch_w:g}" height="14">{it.swatch(0, 0)}</svg>' if it.swatch_w else ""
        spans.append(f"<span>{sw}{escape(it.name)}</span>")
    return f'<div class="{cls}">' + "".join(spans) + "</div>"


def legend_svg(width: float, items: list[Item] | None = None, top: float = 0.0, title: str = "") -> tuple[str, float]:
    """The legend as a hidden nested <svg class="v41-xlegend"> whose rows wrap at `width` design px, placed with
    its bottom `top` px above the drawing (y < 0); returns it and its height. Export shows it."""
    items = diagram_items() if items is None else items
    parts, x, y = [], 6.0, 6.0
    if title:
        parts.append(f'<text x="{x}" y="{y + 7}" dominant-baseline="central" font-size="{FONT}" font-weight="bold" '
                     f'fill="#111827">{escape(title)}</text>')
        y += ROW_H
    for it in items:
        w = it.swatch_w + (5 if it.swatch_w else 0) + text_px(it.name, FONT, False) + 14
        if x > 6 and x + w > width:
            x, y = 6.0, y + ROW_H
        parts.append(it.swatch(x, y))
        tx = x + it.swatch_w + (5 if it.swatch_w else 0)
        parts.append(f'<text x="{round(tx, 1)}" y="{y + 7}" dominant-baseline="central" font-size="{FONT}" '
                     f'fill="#374151">{escape(it.name)}</text>')
        x += w
    height = y + ROW_H + 4
    svg = (f'<svg class="v41-xlegend" x="0" y="{round(-top - height, 1)}" width="{round(width, 1)}" '
           f'height="{round(height, 1)}" display="none">{"".join(parts)}</svg>')
    return svg, height
