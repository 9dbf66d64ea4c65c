"""The memory plan as tables and a per-device figure (engine.plan.memory_plan), without Streamlit."""
from __future__ import annotations

import math
from html import escape

import pandas as pd

from engine.accounting.accounting import GIB
from engine.plan.fit import Option
from engine.plan.memory_plan import MemoryPlan, context_label

from .details import human

# Bar segments of the per-GPU figure: which parts each stacks, and its colour.
SEGMENTS = (("routed experts", ("routed_experts",), "#3b6ea5"),
            ("dense weights", ("shared_experts", "router", "attention", "compressor", "indexer", "mhc", "norms",
                               "embedding", "head", "engram_projections", "wo_a"), "#7aa6d6"),
            ("drafter", ("drafter",), "#8e6bb8"),
            ("KV caches", ("window", "compressed", "index_keys"), "#c8741c"),
            ("working buffers", ("working",), "#9ca3af"))


def placement_table(plan: MemoryPlan) -> pd.DataFrame:
    """One row per part: where it goes, its checkpoint bytes, the most any GPU holds of it, and the rule."""
    def row(part, where, checkpoint, gpu_max, rule):
        return {"part": part, "where": where, "checkpoint": human(checkpoint, "B") if checkpoint else "–",
                "per GPU (max)": human(gpu_max, "B") if gpu_max else "–",
                "checkpoint bytes": checkpoint or None, "rule": rule}

    def where(p) -> str:
        if not p.host:
            return "GPUs"
        if p.key == "engram_tables":
            return "host (shard files)"
        return "host RAM" if not max(p.gpu) else "GPUs + host RAM"

    rows = [row(p.label, where(p), p.checkpoint, max(p.gpu), p.rule) for p in plan.weights]
    weights_max = max(sum(p.gpu[r] for p in plan.weights) for r in range(plan.hardware.gpus))
    rows.append(row("total weights", "GPUs + host", plan.checkpoint_bytes, weights_max,
                    "equals the accounting layer's checkpoint bytes"))
    rows += [row(p.label, "GPUs", 0, max(p.gpu), p.rule) for p in plan.runtime]
    return pd.DataFrame(rows).astype({"checkpoint bytes": "Int64"})  # exact integers; empty for caches


def fit_table(options: tuple[Option, ...]) -> pd.DataFrame:
    """The "what fits" table: one row per GPU count (= TP/EP degree) × expert placement, fewest GPUs first, at the
    longest context that fits (engine.plan.fit, as `python -m engine plan --fit`)."""
    return pd.DataFrame([{"GPUs": o.gpus, "routed experts": "host RAM" if o.experts == "host" else "on the GPUs",
                          "context": context_label(o.plan.hardware.context), "per GPU (max)": human(o.per_gpu, "B"),
                          "host RAM": human(o.plan.host.need, "B"), "verdict": o.reason} for o in options])


def device_table(plan: MemoryPlan) -> pd.DataFrame:
    rows = [{"device": v.device, "verdict": v.text} for v in (*plan.gpus, plan.host)]
    return pd.DataFrame(rows)


def device_bars_svg(plan: MemoryPlan, width: int = 720) -> str:
    """Stacked GiB per GPU by segment as an SVG, with the GPU's memory as a dashed line; GPUs that hold the same
    bytes share a bar ('GPU 1–7'). Plain SVG: the page draws it without a chart library."""
    parts = {p.key: p for p in (*plan.weights, *plan.runtime)}
    loads = [tuple(sum(parts[k].gpu[r] for k in keys if k in parts) for _, keys, _ in SEGMENTS)
             for r in range(plan.hardware.gpus)]
    bars: list[tuple[str, tuple[int, ...]]] = []
    first = 0
    for r in range(1, len(loads) + 1):
        if r == len(loads) or loads[r] != loads[first]:
            bars.append((f"GPU {first}" if r - first == 1 else f"GPU {first}–{r - 1}", loads[first]))
            first = r
    capacity = plan.hardware.gpu_mem_gib
    top = max(capacity, max(sum(b) for _, b in bars) / GIB) * 1.08
    left, bar_h, pitch, y0 = 78, 16, 22, 44
    span = width - left - 16
    height = y0 + pitch * len(bars) + 26

    def x(gib: float) -> float:
        return round(left + span * gib / top, 1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
           f'style="max-width:{width}px;font-family:inherit;font-size:12px" role="img" '
           f'aria-label="GiB per GPU by part">']
    lx = left
    for label, _, colour in SEGMENTS:   # legend
        out.append(f'<rect x="{lx}" y="6" width="11" height="11" fill="{colour}"/>'
                   f'<text x="{lx + 15}" y="15" fill="#374151">{escape(label)}</text>')
        lx += 26 + 6.2 * len(label)
    for i, (label, load) in enumerate(bars):
        y, at = y0 + i * pitch, 0.0
        out.append(f'<text x="{left - 6}" y="{y + bar_h - 4}" text-anchor="end" fill="#374151">{escape(label)}</text>')
        for (name, _, colour), nbytes in zip(SEGMENTS, load):
            gib = nbytes / GIB
            if gib > 0:
                out.append(f'<rect x="{x(at)}" y="{y}" width="{round(x(at + gib) - x(at), 1)}" height="{bar_h}" '
                           f'fill="{colour}"><title>{escape(label)} · {escape(name)}: {gib:.2f} GiB</title></rect>')
            at += gib
    bottom = y0 + pitch * len(bars)
    out.append(f'<line x1="{x(capacity)}" y1="{y0 - 8}" x2="{x(capacity)}" y2="{bottom}" stroke="#b91c1c" '
               f'stroke-dasharray="4 3"/><text x="{x(capacity)}" y="{y0 - 11}" text-anchor="middle" '
               f'fill="#b91c1c">{capacity:g} GiB</text>')
    step = _tick_step(top)
    for k in range(int(top // step) + 1):
        out.append(f'<text x="{x(k * step)}" y="{bottom + 16}" text-anchor="middle" fill="#6b7280">'
                   f'{k * step:g}</text>')
    out.append(f'<text x="{width - 16}" y="{bottom + 16}" text-anchor="end" fill="#6b7280">GiB</text></svg>')
    return "".join(out)


def _tick_step(top: float) -> float:
    """A 1-2-5 step giving 4 to 10 ticks up to top."""
    step = 10 ** math.floor(math.log10(top / 5))
    for m in (1, 2, 5, 10):
        if top / (step * m) <= 8:
            return step * m
    return step * 10
