"""Colour scales for painted values: sequential for one run, diverging around a centre for differences."""
from __future__ import annotations

import math
from dataclasses import dataclass

SEQUENTIAL = ("#fef3c7", "#fde68a", "#fcc74d", "#f7ad45", "#f39340")   # the box's grey subtitle keeps >= 3:1
DIVERGING = ("#7fb0f0", "#bcd5f6", "#f8fafc", "#f6c1c1", "#f08a8a")
# Routing agreement (0 = no shared expert … 1 = the same experts), on the diagram and in the Compare heatmap alike:
# one light-to-teal ramp, no red (a low agreement is a fact about two runs, not an alarm).
AGREEMENT = ("#f8fafc", "#dcefe9", "#bfe3d9", "#9fd5c7", "#7cc5b4")   # MUTED subtitles keep >= 3:1
NOT_RECORDED = "#e5e7eb"     # a box the metric applies to, without data in this run


@dataclass(frozen=True)
class Scale:
    """Values lo..hi onto a colour ramp; with `centre` a diverging ramp: lo..centre onto its blue half, centre..hi
    onto its red half (centre is white). style: how the legend writes a value, 'fixed' (digits after the point),
    'percent' or 'sci' (scientific, for differences of 1e-6)."""
    lo: float
    hi: float
    digits: int = 2
    centre: float | None = None
    style: str = "fixed"
    ramp: tuple[str, ...] | None = None   # stops of a sequential scale other than SEQUENTIAL

    @classmethod
    def sequential(cls, lo: float, hi: float, digits: int = 2, style: str = "fixed") -> Scale:
        if not hi > lo:
            hi = lo + (1.0 if lo == 0 else abs(lo) * 0.01 or 1.0)
        return cls(float(lo), float(hi), digits, None, style)

    @classmethod
    def diverging(cls, centre: float, half: float, digits: int = 2, style: str = "fixed") -> Scale:
        """centre ∓ half: a difference (centre 0) whose largest size is half."""
        half = float(half) if half > 0 and math.isfinite(half) else 1.0
        return cls(centre - half, centre + half, digits, float(centre), style)

    @classmethod
    def around(cls, lo: float, centre: float, hi: float, digits: int = 2) -> Scale:
        """A bounded quantity (an agreement in 0..1) coloured against a reference level inside its range."""
        return cls(float(lo), float(hi), digits, float(centre))

    @classmethod
    def agreement(cls) -> Scale:
        """An agreement in 0..1 on the AGREEMENT ramp."""
        return cls(0.0, 1.0, 2, None, "fixed", AGREEMENT)

    @property
    def stops(self) -> tuple[str, ...]:
        return self.ramp or (SEQUENTIAL if self.centre is None else DIVERGING)

    def plotly_scale(self) -> list[list]:
        """The same stops as a plotly colorscale (for a heatmap from lo to hi)."""
        stops = self.stops
        return [[i / (len(stops) - 1), c] for i, c in enumerate(stops)]

    def position(self, value: float) -> float:
        """Where a value sits on the ramp, 0..1 (a diverging scale puts the centre at 0.5)."""
        if self.centre is None:
            t = (value - self.lo) / (self.hi - self.lo)
        elif value < self.centre:
            t = 0.5 * (value - self.lo) / (self.centre - self.lo) if self.centre > self.lo else 0.0
        else:
            t = 0.5 + 0.5 * (value - self.centre) / (self.hi - self.centre) if self.hi > self.centre else 1.0
        return min(max(t, 0.0), 1.0)

    def colour(self, value: float) -> str:
        """The fill of a value (NaN: the not-recorded grey); values outside lo..hi take the end colours."""
        if value is None or not math.isfinite(value):
            return NOT_RECORDED
        stops = self.stops
        x = self.position(value) * (len(stops) - 1)
        i = min(int(x), len(stops) - 2)
        return _mix(stops[i], stops[i + 1], x - i)

    def values(self, n: int = 5) -> list[float]:
        """The legend's n values: evenly spaced, or for a diverging scale each half evenly spaced."""
        if self.centre is None:
            return [self.lo + (self.hi - self.lo) * i / (n - 1) for i in range(n)]
        half = n // 2
        below = [self.lo + (self.centre - self.lo) * i / half for i in range(half)]
        above = [self.centre + (self.hi - self.centre) * i / half for i in range(1, half + 1)]
        return below + [self.centre] + above

    def label(self, value: float) -> str:
        """A value as the legend and the boxes write it (a difference, centred at 0, with its sign)."""
        sign = "+" if self.centre == 0 else ""
        if self.style == "percent":
            return f"{value * 100:{sign}.{max(self.digits - 2, 0)}f}%"
        if self.style == "sci":
            return "0" if value == 0 else f"{value:{sign}.1e}"
        return f"{value:{sign}.{self.digits}f}"

    def legend(self, n: int = 5, low: str = "", high: str = "") -> list[tuple[str, str]]:
        """n swatches from lo to hi, each labelled with its value; the end labels can say what they mean."""
        out = []
        values = self.values(n)
        for i, v in enumerate(values):
            text = self.label(v)
            if i == 0 and low:
                text += f" ({low})"
            if i == len(values) - 1 and high:
                text += f" ({high})"
            out.append((self.colour(v), text))
        return out


def _mix(a: str, b: str, t: float) -> str:
    ca, cb = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (a, b))
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb))
