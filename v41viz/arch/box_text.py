"""Fit a box's title and subtitle inside the box at the narrowest supported page width (wrap, then shrink)."""
from __future__ import annotations

# The diagram stretches to its column; at a 1280 px wide window one diagram unit is ~28 px wide (measured), its
# narrowest supported width. Vertically a unit is UNIT_PX (the figure's height is set from it).
MIN_PX_PER_UNIT = 27.5
PAD_PX = 4.0
LINE_HEIGHT = 1.3            # plotly's line spacing, in ems
EM_PER_CHAR = {True: 0.5, False: 0.46}  # bold / regular, mean advance per character (measured ~0.40–0.48)
# (title, subtitle) scale factors tried in turn: the subtitle gives way first
FONT_STEPS = ((1.0, 1.0), (1.0, 0.9), (1.0, 0.84), (0.92, 0.84), (0.85, 0.78), (0.78, 0.72), (0.72, 0.66))


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


def fit_box_text(title: str, subtitle: str, w_units: float, h_px: float, title_size: float,
                 subtitle_size: float, bold: bool) -> tuple[str, float]:
    """The annotation HTML and its base font size (plotly spaces every line by it: the title's): both texts wrapped
    to the box width, fonts shrunk until the lines fit its height."""
    width = w_units * MIN_PX_PER_UNIT - PAD_PX
    for title_scale, subtitle_scale in FONT_STEPS:
        ts, ss = title_size * title_scale, subtitle_size * subtitle_scale
        tl = wrap(title, ts, bold, width)
        sl = wrap(subtitle, ss, False, width) if subtitle else []
        tall = LINE_HEIGHT * ts * (len(tl) + len(sl) - 1) + ts  # first baseline to last, plus a line of ink
        wide = max(text_px(t, ts, bold) for t in tl)
        if subtitle:
            wide = max(wide, max(text_px(s, ss, False) for s in sl))
        if tall <= h_px - 2 and wide <= width:
            break
    head = "<br>".join(f"<b>{t}</b>" if bold else t for t in tl)
    title_html = f"<span style='font-size:{ts:.1f}px'>{head}</span>"
    if not sl:
        return title_html, ts
    return title_html + "<br>" + "<br>".join(
        f"<span style='font-size:{ss:.1f}px;color:#4b5563'>{s}</span>" for s in sl), ts
