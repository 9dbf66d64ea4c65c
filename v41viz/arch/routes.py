"""The path of each arrow, in diagram units: straight, bracketed, diagonal, around the right, or along a bus."""
from __future__ import annotations

from .boxes import Box, Edge, Layout

Point = tuple[float, float]
STUB = 0.5          # length of the arrows into the first box and out of the last
BRACKET = 0.25      # the residual bracket, left of the detail column
BUS_DROP = 0.38     # an opened box's input bus lies this far above its first row


def edge_points(lay: Layout, e: Edge) -> list[Point]:
    """The polyline of one edge; arrows end on the second box's border."""
    if e.route == "in":
        b = lay.boxes[e.b]
        return [(b.x, b.top - STUB), (b.x, b.top)]
    if e.route == "out":
        a = lay.boxes[e.a]
        return [(a.x, a.bottom), (a.x, a.bottom + STUB)]
    a, b = lay.boxes[e.a], lay.boxes[e.b]
    if e.kind == "residual":  # bracket on the left of the detail column, bypassing the sublayer
        xl = a.left - BRACKET
        return [(a.left, a.y), (xl, a.y), (xl, b.y), (b.left, b.y)]
    route = {"down": _down, "diag": _diag, "bypass": _bypass, "elbow": _elbow, "bus": _bus}.get(e.route)
    return route(a, b) if route else _auto(a, b, e.kind)


def _auto(a: Box, b: Box, kind: str) -> list[Point]:
    if abs(a.x - b.x) < 1e-6:  # vertical: bottom of a to top of b
        start, end = (a.x, a.bottom), (b.x, b.top)
    elif a.x < b.x:
        start, end = (a.right, a.y), (b.left, b.y)
    else:
        start, end = (a.left, a.y), (b.right, b.y)
    if kind == "aux" and abs(a.y - b.y) > 2 and abs(a.x - b.x) > 1e-6:  # long link: route along the top
        start, end = (a.left, a.y), (b.x, b.top)
    return [start, end]


def _down(a: Box, b: Box) -> list[Point]:
    """Straight down where the two boxes overlap: at a's centre if b is under it, else at b's, else the middle
    of the overlap."""
    if b.left <= a.x <= b.right:
        x = a.x
    elif a.left <= b.x <= a.right:
        x = b.x
    else:
        x = (max(a.left, b.left) + min(a.right, b.right)) / 2
    return [(x, a.bottom), (x, b.top)]


def _diag(a: Box, b: Box) -> list[Point]:
    """From a's lower right to b's upper left (a qr path into the indexer, crossing the gap between rows)."""
    return [(a.right - 0.3, a.bottom), (b.left + 0.3, b.top)]


def _bypass(a: Box, b: Box) -> list[Point]:
    """Out of a's right side, down beside everything in a's lane, into b's right side."""
    xr = max(a.right, b.right) + 0.35
    return [(a.right, a.y), (xr, a.y), (xr, b.y + 0.15), (b.right, b.y + 0.15)]


def _elbow(a: Box, b: Box) -> list[Point]:
    """Down from a, then sideways into b (the shared expert's output joining the combine)."""
    side = b.right if b.x < a.x else b.left
    return [(a.x, a.bottom), (a.x, b.y), (side, b.y)]


def _bus(frame: Box, b: Box) -> list[Point]:
    """An opened box's input: from where it enters the frame, along the bus, down into one step."""
    bus_y = b.top - BUS_DROP
    return [(frame.flow_x, frame.top), (frame.flow_x, bus_y), (b.x, bus_y), (b.x, b.top)]
