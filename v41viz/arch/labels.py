"""Where each arrow's shape label goes: beside the arrow, on no box and on no other label (greedy, first fit)."""
from __future__ import annotations

from dataclasses import dataclass

from .box_text import PX_X, PX_Y, text_px
from .boxes import Layout
from .routes import Point

LABEL_SIZE = 8.5                       # design px
LABEL_H = LABEL_SIZE * 1.3 / PX_Y      # units: the text's height with a little air
GAP = 0.09                             # units between an arrow and its label
TITLE_BAND = 0.5                       # units: an opened box's title row, kept free of labels
Rect = tuple[float, float, float, float]   # x0, y0, x1, y1 in units


@dataclass(frozen=True)
class Label:
    text: str
    x: float        # the anchor: the text's left end (start), centre (middle) or right end (end)
    y: float        # the text's vertical middle
    anchor: str
    edge: int       # index into Layout.edges

    @property
    def rect(self) -> Rect:
        w = text_px(self.text, LABEL_SIZE, False) / PX_X
        x0 = {"start": self.x, "middle": self.x - w / 2, "end": self.x - w}[self.anchor]
        return x0, self.y - LABEL_H / 2, x0 + w, self.y + LABEL_H / 2


def box_rects(lay: Layout) -> list[Rect]:
    """What a label may not cover: every box (a folded group with its card pile and badge), an opened box's
    title row and borders, and the detail frame's title."""
    out = []
    for b in lay.boxes.values():
        if b.container:   # its title row, and its top and bottom borders (a label there reads struck through)
            out += [(b.left, b.top - 0.03, b.right, b.top + TITLE_BAND),
                    (b.left, b.bottom - 0.03, b.right, b.bottom + 0.03)]
            continue
        out.append((b.left, b.top - (0.1 if b.stacked else 0), b.right + (0.2 if b.stacked else 0), b.bottom))
        if b.badge:
            w = (text_px(b.badge, 11.0, True) + 8) / PX_X
            out.append((b.right + 0.24, b.y - 9 / PX_Y, b.right + 0.24 + w, b.y + 9 / PX_Y))
    x0, y0, x1, _ = lay.detail_frame
    if x1 > x0:
        out.append((x0, y0, x0 + 0.1 + text_px(lay.detail_title, 12, True) / PX_X, y0 + 0.4))
    return out


def overlap(r: Rect, s: Rect) -> bool:
    return r[0] < s[2] and s[0] < r[2] and r[1] < s[3] and s[1] < r[3]


def place_labels(lay: Layout, paths: list[list[Point]]) -> tuple[list[Label], list[int]]:
    """Labels for the edges that carry one (paths[i] is edge i's polyline); returns them and the indices of the
    edges whose label found no free place (left unlabelled)."""
    taken = box_rects(lay)
    placed, dropped = [], []
    wanted = [i for i, e in enumerate(lay.edges) if e.label and e.kind != "residual"]
    for i in sorted(wanted, key=lambda i: lay.edges[i].kind != "flow"):   # the data flow's labels first
        e, pts = lay.edges[i], paths[i]
        for cand in _candidates(e.label, pts, i):
            if not any(overlap(cand.rect, r) for r in taken):
                placed.append(cand)
                taken.append(cand.rect)
                break
        else:
            dropped.append(i)
    return placed, dropped


def _candidates(text: str, pts: list[Point], edge: int):
    """Beside the longest segment first: at its middle, then a third in from either end; right of a vertical
    arrow before left of it, above a horizontal one before below it."""
    segments = sorted(zip(pts, pts[1:]), key=lambda s: -abs(s[1][0] - s[0][0]) - abs(s[1][1] - s[0][1]))
    for (x0, y0), (x1, y1) in segments:
        for t in (0.5, 0.3, 0.7):
            mx, my = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
            if abs(x1 - x0) < 1e-6:
                yield Label(text, mx + GAP, my, "start", edge)
                yield Label(text, mx - GAP, my, "end", edge)
            elif abs(y1 - y0) < 1e-6:
                yield Label(text, mx, my - LABEL_H / 2 - 0.04, "middle", edge)
                yield Label(text, mx, my + LABEL_H / 2 + 0.04, "middle", edge)
            else:
                yield Label(text, mx + 2 * GAP, my, "start", edge)
                yield Label(text, mx - 2 * GAP, my, "end", edge)
