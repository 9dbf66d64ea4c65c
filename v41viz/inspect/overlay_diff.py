"""Two runs' difference painted on run A's diagram: routing agreement, and B − A of gates, gains and acceptance."""
from __future__ import annotations

import math

import numpy as np

from engine.trace import Trace

from . import layer_facts as lf
from .overlay import Cell, Overlay
from .overlay_scale import Scale
from .run_diff import RunDiff
from .tokens import visible

SIDES = ("A higher", "B higher")   # what a difference's legend ends mean
DIFF_METRICS = {
    "agreement": "routing agreement (Jaccard of the chosen experts)",
    "gate": "Engram gate, B − A",
    "gain": "mHC composite gain, B − A",
    "acceptance": "DSpark acceptance, B − A",
}


def aligned_positions(diff: RunDiff, index: int) -> tuple[int | None, int | None, str]:
    """Line `index` of the token alignment: (A's position, B's position; None where a run has no token there) and
    how the token pickers name it."""
    line = diff.tokens.table.iloc[index]
    a, b = int(line["A pos"]), int(line["B pos"])
    texts = [f"'{visible(str(line[f'{s} text']))}'" if p >= 0 else "–" for s, p in (("A", a), ("B", b))]
    shown = texts[0] if line["same"] else f"A {texts[0]} / B {texts[1]}"
    name = f"{'prompt' if line['part'] == 'prompt' else 'new'} token {int(line['index'])} · {shown}"
    return (a if a >= 0 else None), (b if b >= 0 else None), name


def diff_overlay(diff: RunDiff, a: Trace, b: Trace, metric: str, index: int | None = None, row: int = 0) -> Overlay:
    """The metric's difference on the boxes of run A's diagram (module paths; B's layers are matched by number),
    for every token (index None) or for line `index` of the token alignment."""
    if metric not in DIFF_METRICS:
        raise ValueError(f"unknown diff metric {metric!r}; choose one of {', '.join(DIFF_METRICS)}")
    if index is None:
        where, pa, pb = "all tokens", None, None
    else:
        pa, pb, where = aligned_positions(diff, index)
    built = {"agreement": _agreement, "gate": _gate, "gain": _gain, "acceptance": _acceptance}[metric](
        diff, a, b, index is not None, pa, pb, row)
    return Overlay(metric, f"{DIFF_METRICS[metric]} · {where}", *built)


def _missing(one: int | None, other: int | None) -> str:
    return "A has no token here" if one is None else "B has no token here" if other is None else ""


def _agreement(diff: RunDiff, a: Trace, b: Trace, one: bool, pa, pb, row: int):
    cells: dict[str, Cell] = {}
    chance = diff.chance_agreement
    scale = Scale.agreement()   # the Compare page's heatmap uses the same scale
    ends = ("no shared expert", "identical")
    if not diff.routing_comparable:
        return cells, scale, f"Routing agreement is {diff.routing_note}.", ends
    paths = sorted({p for p in diff.routing["layer"]}, key=lf.layer_number)
    for path in paths:
        layer = f"layers.{lf.layer_number(path)}"
        if one:
            x, y = (None if p is None else lf.token_routing(t, path, row, p) for t, p in ((a, pa), (b, pb)))
            if x is None or y is None:
                why = _missing(pa, pb) or "not recorded at this token (the last token is never fed back)"
                cell = Cell(math.nan, "–", f"{path}: {why}")
            else:
                sa, sb = {int(e) for e in x[0]}, {int(e) for e in y[0]}
                j = len(sa & sb) / len(sa | sb) if sa | sb else math.nan
                cell = Cell(j, f"{j:.2f}", f"{path}: A chose {sorted(sa)}, B chose {sorted(sb)}: Jaccard {j:.2f} "
                                           f"(chance {chance:.2f})")
        else:
            mine = diff.routing[diff.routing["layer"] == path]
            same = mine[mine["same input"].astype(bool)]
            use, over = (same, "the tokens both models read identically") if len(same) else \
                (mine, "every token both recorded (no same-input tokens)")
            j = float(use["jaccard"].mean()) if len(use) else math.nan
            cell = Cell(j, f"{j:.2f}", f"{path}: mean Jaccard {j:.2f} of the experts A and B chose, over {over} "
                                       f"({len(use)} tokens); chance {chance:.2f}")
        cells[path] = cells[layer] = cell
    note = (f"How often both runs chose the same experts at a layer (Jaccard overlap; {chance:.2f} is the chance level "
            f"of independent choices). {diff.routing_note[:1].upper()}{diff.routing_note[1:]}.")
    return cells, scale, note, ends


def _gate(diff: RunDiff, a: Trace, b: Trace, one: bool, pa, pb, row: int):
    cells: dict[str, Cell] = {}
    paths = sorted(set(a.paths("engram")) | set(b.paths("engram")), key=lf.layer_number)
    for path in paths:
        ga, gb = (lf.mean_gate(t, path, row, p) if path in t.paths("engram") and (not one or p is not None)
                  else math.nan for t, p in ((a, pa), (b, pb)))
        if math.isfinite(ga) and math.isfinite(gb):
            cells[path] = Cell(gb - ga, f"{gb - ga:+.2f}", f"{path}: mean gate A {ga:.3f}, B {gb:.3f}: B − A = "
                                                           f"{gb - ga:+.3f}")
        else:
            only = "B" if math.isfinite(gb) else "A" if math.isfinite(ga) else ""
            why = (_missing(pa, pb) if one else "") or (f"only {only} recorded this Engram layer" if only
                                                          else "not recorded")
            cells[path] = Cell(math.nan, f"{only} only" if only else "–", f"{path}: {why}")
    half = max([abs(c.value) for c in cells.values() if math.isfinite(c.value)] + [0.05])
    note = "B's mean Engram gate minus A's, per Engram layer (red: B adds more of its memory)." if paths else \
        "Neither run has Engram layers."
    return cells, Scale.diverging(0.0, half), note, SIDES


def _gain(diff: RunDiff, a: Trace, b: Trace, one: bool, pa, pb, row: int):
    cells: dict[str, Cell] = {}
    ga = lf.seam_gains(a, row, pa) if not one or pa is not None else {}
    gb = lf.seam_gains(b, row, pb) if not one or pb is not None else {}
    for seam in sorted(set(ga) | set(gb), key=lambda s: (lf.layer_number(s[0]), s[1])):
        path, site = seam
        if seam in ga and seam in gb:
            d = gb[seam] - ga[seam]
            cell = Cell(d, f"{d:+.1e}", f"{path}.hc_{site}: composite gain A {ga[seam]:.6f}, B {gb[seam]:.6f}: "
                                        f"B − A = {d:+.2e}")
        else:
            only = "A" if seam in ga else "B"
            cell = Cell(math.nan, f"{only} only", f"{path}.hc_{site}: only {only} recorded this seam")
        cells[f"{path}.hc_{site}"] = cell
        if site == "ffn":
            cells[path] = cell
    half = max([abs(c.value) for c in cells.values() if math.isfinite(c.value)] + [1e-6])
    note = ("B's composite mHC gain minus A's after each seam (both stay near 1: the seams mix the streams without "
            "amplifying them, so the differences are tiny).")
    return cells, Scale.diverging(0.0, half, style="sci"), note, SIDES


def _acceptance(diff: RunDiff, a: Trace, b: Trace, one: bool, pa, pb, row: int):
    cells: dict[str, Cell] = {}
    scale = Scale.diverging(0.0, 1.0, style="percent")
    stages = sorted({p.split(".")[0] + "." + p.split(".")[1] for t in (a, b) for k in ("moe", "mhc")
                     for p in t.paths(k) if p.startswith("mtp.")}, key=lf.layer_number)
    if not stages:
        return cells, scale, "Neither run has a drafter.", SIDES
    head = f"{stages[-1]}.markov_head"
    if one:
        steps = [None if p is None else lf.committing_step(t, row, p) for t, p in ((a, pa), (b, pb))]
        if None in steps:
            missing = " and ".join(s for s, st in zip("AB", steps) if st is None)
            for s in stages:
                cells[s] = Cell(math.nan, "–", f"{s}: no DSpark step of {missing} committed this token")
            return cells, scale, f"No DSpark step of {missing} committed this token.", SIDES
        sa, sb = steps
        rate = [s.accepted / s.verify_len if s.verify_len else math.nan for s in steps]
        per = [y - x for x, y in zip(lf.step_outcomes(sa), lf.step_outcomes(sb))]
        for s in stages:
            cells[s] = Cell(rate[1] - rate[0], _point(rate[1] - rate[0]),
                            f"{s}: A's step {sa.step} accepted {sa.accepted}/{sa.verify_len}, B's step {sb.step} "
                            f"{sb.accepted}/{sb.verify_len}")
        cells[head] = Cell(float(np.nanmean(per)) if any(map(math.isfinite, per)) else math.nan, _percents(per),
                           f"{head}: per draft position, B's outcome minus A's (+100 B accepted where A rejected)")
        return cells, scale, "The DSpark steps that committed this token in A and in B, B − A.", SIDES
    table = diff.dspark
    if "A acceptance" not in table or "B acceptance" not in table:
        return cells, scale, f"DSpark: {diff.dspark_note}", SIDES
    per = [float(y - x) for x, y in zip(table["A acceptance"], table["B acceptance"])]
    rates = [f.dspark.acceptance_rate for f in (diff.a, diff.b)]
    for s in stages:
        cells[s] = Cell(rates[1] - rates[0], _point(rates[1] - rates[0]),
                        f"{s}: share of verified drafts accepted, A {rates[0]:.0%}, B {rates[1]:.0%}")
    cells[head] = Cell(float(np.nanmean(per)) if any(map(math.isfinite, per)) else math.nan, _percents(per),
                       f"{head}: acceptance by draft position, B − A: " + ", ".join(
                           f"draft {k + 1} {'–' if not math.isfinite(d) else f'{d * 100:+.0f}%'}"
                           for k, d in enumerate(per)))
    note = ("B's DSpark acceptance minus A's: the stage boxes compare the share of verified drafts accepted, the "
            "Markov head each draft position's acceptance (percentage points).")
    return cells, scale, note, SIDES


def _percents(values: list[float]) -> str:
    return " ".join("–" if not math.isfinite(v) else f"{v * 100:+.0f}" for v in values)


def _point(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value * 100:+.0f}%"
