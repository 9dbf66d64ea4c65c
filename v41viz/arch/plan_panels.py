"""The memory plan as tables and a per-device figure (engine.plan.memory_plan), without Streamlit."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

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


def device_bars_figure(plan: MemoryPlan) -> go.Figure:
    """Stacked GiB per GPU by segment, with the GPU's memory as a dashed line. A plotly chart, not an inline SVG:
    st.html strips <svg>, so an SVG drawn there showed as an empty element."""
    bars = device_bars(plan)
    labels = [label for label, _ in bars][::-1]    # GPU 0 on top
    fig = go.Figure()
    for i, (name, _, colour) in enumerate(SEGMENTS):
        gib = [load[i] / GIB for _, load in bars][::-1]
        if any(gib):
            fig.add_bar(y=labels, x=gib, name=name, orientation="h", marker_color=colour,
                        hovertemplate=f"%{{y}} · {name}: %{{x:.2f}} GiB<extra></extra>")
    capacity = plan.hardware.gpu_mem_gib
    fig.add_vline(x=capacity, line=dict(color="#b91c1c", dash="dash", width=1.5),
                  annotation=dict(text=f"{capacity:g} GiB per GPU", font=dict(color="#b91c1c", size=11)),
                  annotation_position="top")
    top = max(capacity, max(sum(load) for _, load in bars) / GIB) * 1.08
    fig.update_layout(barmode="stack", height=150 + 30 * len(bars), margin=dict(l=10, r=10, t=64, b=10),
                      xaxis=dict(title="GiB", range=[0, top]), yaxis=dict(type="category", automargin=True),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", traceorder="normal"),
                      title=dict(text="GiB per GPU by part", font=dict(size=13), x=0.01, y=0.985, yanchor="top",
                                 yref="container"))
    return fig
