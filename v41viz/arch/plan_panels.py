"""The memory plan as tables and a per-device figure (engine.spec.memory_plan), without Streamlit."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.spec.accounting import GIB
from engine.spec.memory_plan import MemoryPlan

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

    rows = [row(p.label, "host (shard files)" if p.host else "GPUs", p.checkpoint, max(p.gpu), p.rule)
            for p in plan.weights]
    weights_max = max(sum(p.gpu[r] for p in plan.weights) for r in range(plan.hardware.gpus))
    rows.append(row("total weights", "GPUs + host", plan.checkpoint_bytes, weights_max,
                    "equals the accounting layer's checkpoint bytes"))
    rows += [row(p.label, "GPUs", 0, max(p.gpu), p.rule) for p in plan.runtime]
    return pd.DataFrame(rows).astype({"checkpoint bytes": "Int64"})  # exact integers; empty for caches


def device_table(plan: MemoryPlan) -> pd.DataFrame:
    rows = [{"device": v.device, "verdict": v.text} for v in (*plan.gpus, plan.host)]
    return pd.DataFrame(rows)


def device_figure(plan: MemoryPlan) -> go.Figure:
    """Stacked GiB per GPU by segment, with the GPU's memory as a dashed line."""
    parts = {p.key: p for p in (*plan.weights, *plan.runtime)}
    names = [v.device for v in plan.gpus]
    fig = go.Figure()
    for label, keys, colour in SEGMENTS:
        gib = [sum(parts[k].gpu[r] for k in keys if k in parts) / GIB for r in range(len(names))]
        fig.add_bar(y=names, x=gib, name=label, orientation="h", marker_color=colour,
                    hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>")
    fig.add_vline(x=plan.hardware.gpu_mem_gib, line_dash="dash", line_color="#b91c1c",
                  annotation_text=f"{plan.hardware.gpu_mem_gib:g} GiB", annotation_position="top")
    fig.update_layout(barmode="stack", height=120 + 22 * min(len(names), 32),
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, xaxis_title="GiB",
                      yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": 1.15, "traceorder": "normal"})
    return fig
