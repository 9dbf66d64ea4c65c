"""The memory plan as tables and a per-device figure (engine.plan.memory_plan), without Streamlit."""
from __future__ import annotations

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


def device_bars(plan: MemoryPlan) -> list[tuple[str, tuple[int, ...]]]:
    """(label, bytes per SEGMENTS entry) per bar; GPUs that hold the same bytes share a bar ('GPU 1–7')."""
    parts = {p.key: p for p in (*plan.weights, *plan.runtime)}
    loads = [tuple(sum(parts[k].gpu[r] for k in keys if k in parts) for _, keys, _ in SEGMENTS)
             for r in range(plan.hardware.gpus)]
    bars: list[tuple[str, tuple[int, ...]]] = []
    first = 0
    for r in range(1, len(loads) + 1):
        if r == len(loads) or loads[r] != loads[first]:
            bars.append((f"GPU {first}" if r - first == 1 else f"GPU {first}–{r - 1}", loads[first]))
            first = r
    return bars


def device_bars_html(plan: MemoryPlan) -> str:
    """Stacked GiB per GPU by segment, with the GPU's memory as a dashed line, as plain HTML boxes (st.html keeps
    them; it strips <svg>). Not a plotly chart: the first one on a page makes a fresh browser load and parse
    plotly.js (~4.6 MB), which held back the diagram above it by 3 s; these boxes cost nothing to draw."""
    bars = device_bars(plan)
    capacity = plan.hardware.gpu_mem_gib
    top = max(capacity, max(sum(load) for _, load in bars) / GIB) * 1.08

    def pct(gib: float) -> str:   # a position along the GiB axis
        return f"{100 * gib / top:.3f}%"

    used = [i for i in range(len(SEGMENTS)) if any(load[i] for _, load in bars)]
    legend = "".join(f'<span style="margin-right:1em;white-space:nowrap"><span style="display:inline-block;'
                     f'width:.8em;height:.8em;background:{SEGMENTS[i][2]};margin-right:.3em"></span>'
                     f'{escape(SEGMENTS[i][0])}</span>' for i in used)
    rows = []
    for label, load in bars:
        parts = "".join(f'<div title="{escape(label)} · {escape(SEGMENTS[i][0])}: {load[i] / GIB:,.2f} GiB" '
                        f'style="width:{pct(load[i] / GIB)};background:{SEGMENTS[i][2]}"></div>'
                        for i in used if load[i])
        total = sum(load) / GIB
        rows.append(f'<div class="v41-plan-row" style="display:flex;align-items:center;gap:.5em;margin:.25em 0">'
                    f'<div style="flex:0 0 6.5em;text-align:right;font-size:.85em">{escape(label)}</div>'
                    f'<div style="flex:1;position:relative;height:1.4em;background:#f3f4f6">'
                    f'<div class="v41-plan-bar" role="img" aria-label="{escape(label)}: {total:,.2f} GiB" '
                    f'style="display:flex;height:100%">{parts}</div>'
                    f'<div style="position:absolute;top:-.2em;bottom:-.2em;left:{pct(capacity)};'
                    f'border-left:1.5px dashed #b91c1c"></div></div>'
                    f'<div style="flex:0 0 6em;font-size:.85em">{total:,.1f} GiB</div></div>')
    marker = (f'<div style="display:flex;gap:.5em"><div style="flex:0 0 6.5em"></div><div style="flex:1;'
              f'position:relative;height:1.3em"><span style="position:absolute;left:{pct(capacity)};'
              f'transform:translateX(-50%);white-space:nowrap;color:#b91c1c;font-size:.8em">{capacity:g} GiB per GPU'
              f'</span></div><div style="flex:0 0 6em"></div></div>')
    return (f'<div class="v41-plan-bars" style="margin:.5em 0 1em">'
            f'<div style="font-weight:600;font-size:.9em">GiB per GPU by part</div>'
            f'<div style="font-size:.8em;margin:.2em 0 .3em">{legend}</div>{marker}{"".join(rows)}</div>')
