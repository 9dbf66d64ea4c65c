"""Fit a box's title and subtitle inside the box (wrap, then shrink), in the diagram's design pixels."""
from __future__ import annotations

from dataclasses import dataclass

# The diagram is drawn in design pixels and scaled uniformly by the browser, so text that fits at the design
# size fits at every page width. One diagram unit is PX_X design pixels wide and PX_Y tall.
PX_X, PX_Y = 38.0, 50.0
PAD_PX = 6.0
PAD_Y_PX = 6.0               # top + bottom: the lines' pitch does not hold a glyph's descent, which touched the edge
LINE_HEIGHT = 1.15           # line pitch, in ems of the line's own font
EM_PER_CHAR = {True: 0.5, False: 0.46}  # bold / regular, mean advance per character (measured ~0.40–0.48)
# (title, subtitle) scale factors tried in turn: the subtitle gives way first
FONT_STEPS = ((1.0, 1.0), (1.0, 0.9), (1.0, 0.84), (0.92, 0.84), (0.85, 0.78), (0.78, 0.72), (0.72, 0.66))


@dataclass(frozen=True)
class Line:
    text: str
    size: float      # font size in design pixels
    bold: bool
    muted: bool      # a subtitle line (grey)


def text_px(text: str, size: float, bold: bool) -> float:
    return len(text) * size * EM_PER_CHAR[bold]


def wrap(text: str, size: float, bold: bool, width_px: float) -> list[str]:
    """Greedy word wrap at spaces; the ' · ' separators end a line rather than start one."""
    words = text.replace(" · ", "\u00a0· ").split(" ")  # a line may end with '·', never start with it
    lines: list[str] = []
    for w in words:
        if lines and text_px(lines[-1] + " " + w, size, bold) <= width_px:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return [line.replace("\u00a0", " ").rstrip(" ·") for line in lines]


def lines_height(lines: list[Line]) -> float:
    return sum(LINE_HEIGHT * line.size for line in lines)


def fit_box_text(title: str, subtitle: str, w_units: float, h_units: float, title_size: float,
                 subtitle_size: float, bold: bool) -> list[Line]:
    """The box's text lines, both texts wrapped to the box width, fonts shrunk until the lines fit its height."""
    width, height = w_units * PX_X - PAD_PX, h_units * PX_Y - PAD_Y_PX
    for title_scale, subtitle_scale in FONT_STEPS:
        ts, ss = title_size * title_scale, subtitle_size * subtitle_scale
        lines = [Line(t, ts, bold, False) for t in wrap(title, ts, bold, width)]
        if subtitle:
            lines += [Line(s, ss, False, True) for s in wrap(subtitle, ss, False, width)]
        wide = max(text_px(line.text, line.size, line.bold) for line in lines)
        if lines_height(lines) <= height and wide <= width:
            return lines
    return _cut(lines, height, width)


def _cut(lines: list[Line], height: float, width: float) -> list[Line]:
    """Lines that fit no font step: the subtitle lines that still fit the height, the last one ending in '…' (the
    box's tooltip and details keep the whole text). A third subtitle line used to run past the box into the arrow
    label under it."""
    kept = [line for line in lines if not line.muted]
    for line in (line for line in lines if line.muted):
        if lines_height(kept + [line]) > height:
            break
        kept.append(line)
    if len(kept) < len(lines) and kept and kept[-1].muted:
        last = kept[-1]
        text = last.text
        while text and text_px(text + "…", last.size, False) > width:
            text = text[:-1]
        kept[-1] = Line(text.rstrip(" ·") + "…", last.size, False, True)
    return kept
