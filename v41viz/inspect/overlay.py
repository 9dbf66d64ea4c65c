"""A run painted on the diagram: per box a value, a short text and a sentence for one metric, its colour scale."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.trace import Trace, layer_path

from . import layer_facts as lf
from .overlay_scale import NOT_RECORDED, Scale
from .tokens import visible
from .trace_model import trace_model

METRICS = {
    "load": "expert load (max/mean − 1)",
    "entropy": "routing entropy",
    "gate": "Engram gate",
    "gain": "mHC composite gain",
    "attention": "attention: window vs compressed rows",
    "acceptance": "DSpark acceptance by draft position",
}


@dataclass(frozen=True)
class Cell:
    value: float      # what the colour shows (NaN: not recorded)
    text: str         # on the box
    detail: str       # one sentence for the details panel


@dataclass(frozen=True)
class Overlay:
    metric: str
    title: str                            # the legend's title: the metric and the tokens it covers
    cells: dict[str, Cell]                # diagram box id (module path) → its cell
    scale: Scale
    note: str = ""                        # what the colours mean, or why nothing could be painted
    ends: tuple[str, str] = ("", "")      # what the legend's low and high ends mean
    extra_legend: tuple[tuple[str, str], ...] = field(default=())

    def fills(self) -> dict[str, tuple[str, str]]:
        """paint_svg's input: box id → (fill colour, value text)."""
        return {node: (self.scale.colour(c.value), c.text) for node, c in self.cells.items()}

    def legend(self) -> list[tuple[str, str]]:
        items = self.scale.legend(low=self.ends[0], high=self.ends[1]) + list(self.extra_legend)
        if any(not math.isfinite(c.value) for c in self.cells.values()):
            items.append((NOT_RECORDED, "not recorded"))
        return items

    @property
    def painted(self) -> int:
        """How many boxes carry a recorded value."""
        return sum(math.isfinite(c.value) for c in self.cells.values())


@dataclass(frozen=True)
class RunShape:
    """What the overlay needs to know about the model that made the run: from its ModelArgs when known, else from
    the trace alone."""
    n_layers: int
    n_draft_stages: int
    n_routed_experts: int
    draft_n_routed_experts: int
    n_hash_layers: int
    engram_layers: tuple[int, ...]

    @classmethod
    def of(cls, trace: Trace, args=None) -> RunShape:
        if args is not None:
            return cls(args.n_layers, args.n_draft_stages, args.n_routed_experts, args.draft_n_routed_experts,
                       args.n_hash_layers, tuple(args.engram_layer_ids))
        model = trace_model(trace)
        kinds = ("moe", "mhc", "engram", "attention")
        layers = {lf.layer_number(p) for k in kinds for p in trace.paths(k) if p.startswith("layers.")}
        stages = {lf.layer_number(p) for k in kinds for p in trace.paths(k) if p.startswith("mtp.")}
        return cls(max(layers, default=-1) + 1, max(stages, default=-1) + 1, model.n_routed_experts, 0,
                   model.n_hash_layers, tuple(lf.layer_number(p) for p in trace.paths("engram")))

    def experts(self, path: str) -> int:
        return self.draft_n_routed_experts if path.startswith("mtp.") else self.n_routed_experts


def token_label(trace: Trace, pos: int, row: int = 0) -> str:
    """"position 7 · '·fox' (new)": a token as the pickers and titles name it (whitespace made visible)."""
    rec = next((t for t in trace.tokens(row) if t.pos == pos), None)
    if rec is None:
        return f"position {pos}"
    return f"position {pos} · '{visible(rec.text)}' ({'new' if rec.generated else 'prompt'})"


def overlay(trace: Trace, metric: str, pos: int | None = None, args=None, row: int = 0) -> Overlay:
    """The chosen metric of a run on the diagram's boxes, over all tokens (pos None) or for the token at `pos`.
    args: the run's ModelArgs (None: inferred from the trace)."""
    if metric not in METRICS:
        raise ValueError(f"unknown overlay metric {metric!r}; choose one of {', '.join(METRICS)}")
    shape = RunShape.of(trace, args)
    tokens = "all tokens" if pos is None else token_label(trace, pos, row)
    built = BUILDERS[metric](trace, shape, pos, row)
    return Overlay(metric, f"{METRICS[metric]} · {tokens}", *built)


def _with_layer_box(cells: dict[str, Cell], path: str, cell: Cell) -> None:
    """A module's cell, also on its layer's box in the stack (or its stage's in the drafter column), which shows
    every layer while the detail column shows only the focused one."""
    cells[path] = cell
    cells[layer_path(path)] = cell


def _load(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    for path in trace.paths("moe"):
        n = shape.experts(path) or None
        load = trace.expert_load(path, n).astype(np.float64)
        mean = load.mean() if load.size and load.sum() > 0 else math.nan
        hashed = " (hash-routed: experts from the token id)" if _hashed(path, shape) else ""
        if pos is None:
            v = lf.load_violation(trace, path, n or 0)
            busiest = int(load.argmax()) if load.size else -1
            cells_detail = (f"{path}{hashed}: the busiest expert ({busiest}) took {load.max():.0f} of "
                            f"{load.sum():.0f} routed slots, {v + 1:.2f}× the mean load (max/mean − 1 = {v:.2f})"
                            if math.isfinite(v) else f"{path}: no routing recorded")
            _with_layer_box(cells, path, Cell(v, f"{v:.2f}" if math.isfinite(v) else "–", cells_detail))
            continue
        chosen = lf.token_routing(trace, path, row, pos)
        if chosen is None or not math.isfinite(mean):
            _with_layer_box(cells, path, Cell(math.nan, "–", f"{path}: no routing recorded for this token"))
            continue
        ids, weights = chosen
        relative = load[ids] / mean
        parts = ", ".join(f"{int(e)} (weight {w:.2f}, {r:.2f}× mean load)" for e, w, r in zip(ids, weights, relative))
        _with_layer_box(cells, path, Cell(float(relative.mean() - 1.0), " ".join(f"e{int(e)}" for e in ids),
                                          f"{path}{hashed}: the token chose experts {parts} over the run"))
    values = [c.value for c in cells.values() if math.isfinite(c.value)]
    if pos is None:
        note = ("How unevenly each MoE layer spread the run's tokens over its experts: max/mean − 1 of the expert "
                "load (0 = perfectly even).")
        return cells, Scale.sequential(0.0, max(values + [0.1])), note, ("even", "")
    note = ("The experts this token chose, coloured by how busy they were over the whole run: their mean load "
            "relative to the layer's mean, minus 1 (0 = an average expert, above 0 = the crowded ones).")
    top = max(values + [0.1])
    return cells, Scale.around(-1.0, 0.0, top), note, ("idle experts", "busy experts")


def _entropy(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    k = 1
    for path in trace.paths("moe"):
        n = shape.experts(path)
        if pos is None:
            h = lf.load_entropy(trace, path, n)
            top = math.log2(n) if n else math.nan
            _with_layer_box(cells, path, Cell(h, f"{h:.2f} b" if math.isfinite(h) else "–",
                                              f"{path}: the expert load has {h:.2f} bits of entropy (uniform over "
                                              f"{n} experts: {top:.2f})" if math.isfinite(h) else
                                              f"{path}: no routing recorded"))
            continue
        chosen = lf.token_routing(trace, path, row, pos)
        if chosen is None:
            _with_layer_box(cells, path, Cell(math.nan, "–", f"{path}: no routing recorded for this token"))
            continue
        ids, weights = chosen
        k = max(k, len(ids))
        h = lf.entropy_bits(weights)
        _with_layer_box(cells, path, Cell(h, f"{h:.2f} b", f"{path}: the token split its routing weights "
                                          + ", ".join(f"{w:.2f}" for w in weights) + " over experts "
                                          + ", ".join(str(int(e)) for e in ids) + f": {h:.2f} bits"))
    if pos is None:
        top = math.log2(max(shape.n_routed_experts, 2))
        note = (f"Entropy of each MoE layer's expert load over the run, in bits ({top:.2f} = every expert equally "
                "busy; draft stages have their own, smaller expert sets).")
        return cells, Scale.sequential(0.0, top), note, ("one expert", "uniform")
    note = (f"How evenly this token split its routing weight over its {k} chosen experts, in bits "
            f"({math.log2(k):.2f} = equal weights).")
    return cells, Scale.sequential(0.0, math.log2(k) if k > 1 else 1.0), note, ("one expert", "equal")


def _gate(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    recorded = set(trace.paths("engram"))
    paths = sorted(recorded | {f"layers.{n}.engram" for n in shape.engram_layers}, key=lf.layer_number)
    for path in paths:
        g = lf.mean_gate(trace, path, row, pos) if path in recorded else math.nan
        where = "over the run's tokens" if pos is None else "for this token"
        cells[path] = Cell(g, f"{g:.2f}" if math.isfinite(g) else "–",
                           f"{path}: mean gate {g:.3f} {where}, averaged over the mHC streams (0 = the memory is "
                           "ignored, 1 = fully added)" if math.isfinite(g) else f"{path}: no gate recorded")
    note = ("How much each Engram layer adds of the memory rows it looked up: the gate, averaged over the streams"
            + (" and the tokens." if pos is None else ".")) if paths else "This model has no Engram layers."
    return cells, Scale.sequential(0.0, 1.0), note, ("ignored", "fully added")


def _gain(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    gains = lf.seam_gains(trace, row, pos)
    for (path, site), g in gains.items():
        cell = Cell(g, f"{g:.4f}", f"{path}.hc_{site}: the residual mixing of every backbone mHC seam up to this one "
                                   f"has gain {g:.5f} (largest row or column sum of the product; 1 = no "
                                   "amplification)" + (", averaged over the tokens" if pos is None else ""))
        cells[f"{path}.hc_{site}"] = cell
        if site == "ffn":
            cells[path] = cell
    values = list(gains.values())
    lo, hi = min(values + [1.0]), max(values + [1.0])
    note = ("Gain of the composite mHC residual mixing after each seam (the product of the seams' doubly stochastic "
            "matrices from the first layer on): 1 when the streams are only mixed, above 1 when they are amplified. "
            "The layer boxes show the gain after the layer's FFN seam; draft stages restart their streams.")
    return cells, Scale.sequential(lo, max(hi, lo + 1e-3), digits=4), note, ("", "")


def _attention(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    recorded = set(trace.paths("attention"))
    paths = sorted(recorded | {f"layers.{n}.attn" for n in range(shape.n_layers)}, key=lf.layer_number)
    for path in paths:
        mass = lf.attention_mass(trace, path, row, pos) if path in recorded else None
        if mass is None:
            why = "not recorded (attention facts are opt-in: 'trace attention' on Inspect)" if not recorded else \
                "not recorded" + (" for this token" if pos is not None else "")
            _with_layer_box(cells, path, Cell(math.nan, "n/r", f"{path}: {why}"))
            continue
        win, comp, sink = mass
        _with_layer_box(cells, path, Cell(comp, f"w{win * 100:.0f} c{comp * 100:.0f}%",
                                          f"{path}: {win:.1%} of the attention on the sliding window, {comp:.1%} on "
                                          f"compressed rows, {sink:.1%} on the sink"
                                          + (" (mean over the tokens)" if pos is None else "")))
    note = ("Where attention went: the share on compressed rows colours the box; the text gives the window (w) and "
            "compressed (c) shares in percent (the sink takes the rest).")
    if not recorded:
        note = ("Attention not recorded: this run did not trace attention (turn on 'trace attention' on Inspect and "
                "generate again).")
    return cells, Scale.sequential(0.0, 1.0, style="percent"), note, ("all on the window", "all compressed")


def _acceptance(trace: Trace, shape: RunShape, pos: int | None, row: int):
    cells: dict[str, Cell] = {}
    stages = [f"mtp.{s}" for s in range(shape.n_draft_stages)]
    if not stages:
        return cells, Scale.sequential(0.0, 1.0, style="percent"), "This model has no drafter.", ("", "")
    head = f"{stages[-1]}.markov_head"
    if pos is None:
        by_pos = lf.acceptance_by_position(trace, row)
        if not by_pos:
            for s in stages:
                cells[s] = Cell(math.nan, "off", f"{s}: this run did not use DSpark")
            return cells, Scale.sequential(0.0, 1.0, style="percent"), \
                "This run did not use DSpark: turn it on on Inspect and generate again.", ("", "")
        steps = [s for s in trace.dspark_steps if s.row == row]
        rate = sum(s.accepted for s in steps) / max(sum(s.verify_len for s in steps), 1)
        text = " ".join("–" if not math.isfinite(a) else f"{a * 100:.0f}" for a in by_pos) + "%"
        listing = ", ".join(f"draft {k + 1}: {'–' if not math.isfinite(a) else f'{a:.0%}'}"
                            for k, a in enumerate(by_pos))
        for s in stages:
            cells[s] = Cell(rate, f"{rate * 100:.0f}%", f"{s}: every stage runs once per step over the whole block of "
                            f"{len(by_pos)} draft positions; {rate:.0%} of the verified drafts were accepted over "
                            f"{len(steps)} steps")
        cells[head] = Cell(float(np.nanmean(by_pos)), text, f"{head} drafts the positions left to right; acceptance "
                           f"by draft position (given the drafts before it were accepted): {listing}")
        note = ("DSpark acceptance: the stage boxes show the share of verified drafts accepted; the Markov head, which "
                "draws the draft positions one after another, lists the acceptance of each position in percent.")
        return cells, Scale.sequential(0.0, 1.0, style="percent"), note, ("none", "all")
    step = lf.committing_step(trace, row, pos)
    if step is None:
        for s in stages:
            cells[s] = Cell(math.nan, "–", f"{s}: no DSpark step committed this token (a prompt token, the prefill's "
                                           "token, or a run without DSpark)")
        return cells, Scale.sequential(0.0, 1.0, style="percent"), \
            "No DSpark step committed this token.", ("", "")
    outcomes = lf.step_outcomes(step)
    marks = "".join("✓" if o == 1 else "✗" if o == 0 else "·" for o in outcomes)
    share = step.accepted / step.verify_len if step.verify_len else math.nan
    which = pos - step.anchor_pos
    made = f"draft {which}" if which <= step.accepted else f"the target's {step.next_kind} token"
    for s in stages:
        cells[s] = Cell(share, f"{step.accepted}/{step.verify_len}", f"{s}: step {step.step} (anchor at position "
                        f"{step.anchor_pos}) had {step.accepted} of {step.verify_len} verified drafts accepted; this "
                        f"token is {made}")
    cells[head] = Cell(share, marks, f"{head}: step {step.step}'s drafts, position by position: {marks} "
                                     "(✓ accepted, ✗ rejected, · not verified)")
    note = (f"The DSpark step that committed this token (step {step.step}): accepted / verified drafts on the stage "
            "boxes, each draft position's outcome on the Markov head.")
    return cells, Scale.sequential(0.0, 1.0, style="percent"), note, ("none", "all")


def _hashed(path: str, shape: RunShape) -> bool:
    return path.startswith("layers.") and lf.layer_number(path) < shape.n_hash_layers


BUILDERS = {"load": _load, "entropy": _entropy, "gate": _gate, "gain": _gain, "attention": _attention,
            "acceptance": _acceptance}
