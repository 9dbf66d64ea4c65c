"""Accounting panels as tables and figures: reconciliation, bytes by format, KV per token, roles, experts touched."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.accounting.accounting import Accounting
from engine.accounting.experts_touched import expected_touched
from engine.accounting.published_figures import published_figures
from engine.spec.config import ModelArgs

from .details import human

# Horizontal legend in the top margin, never over the bars or curves (plotly grows the margin to fit it).
LEGEND_ABOVE = dict(orientation="h", yanchor="bottom", y=1.02, x=0, xanchor="left")
DTYPE_NAMES = {"I8": "FP4 (e2m1, 2 per byte; I8 container)", "F8_E4M3": "FP8 e4m3", "F8_E8M0": "E8M0 block scales",
               "BF16": "BF16", "F32": "FP32"}


def reconciliation(acc: Accounting) -> pd.DataFrame:
    p = acc.to_json()["params"]
    other = p["backbone"] - p["routed_experts"] - p["shared_experts"]
    rows = [("backbone (no Engram tables, drafter, vision)", p["backbone"]),
            ("  routed experts", p["routed_experts"]), ("  shared experts", p["shared_experts"]),
            ("  other (attention, embedding, head, routers, mHC, norms, Engram projections)", other),
            ("Engram tables", p["engram"]), ("DSpark / MTP drafter", p["dspark"]),
            ("total (checkpoint, without vision)", p["total"]),
            ("activated per decode token", p["activated_decode"]),
            ("activated per prefill token", p["activated_prefill"])]
    if p["activated_prefill_exact"] != p["activated_prefill"]:
        rows.append(("activated per prefill token, exact reference prefill", p["activated_prefill_exact"]))
    return pd.DataFrame([{"quantity": q, "parameters": v, "readable": human(v)} for q, v in rows])


def published(args: ModelArgs) -> pd.DataFrame:
    rows = []
    for f in published_figures(args):
        rows.append({"figure": f.label, "exact": f.fmt(f.exact), "published": f.fmt(f.published),
                     "difference": f.fmt(f.difference), "why": f.why})
    return pd.DataFrame(rows, columns=["figure", "exact", "published", "difference", "why"])


def bytes_by_format(acc: Accounting) -> pd.DataFrame:
    by = acc.bytes_by_dtype
    total = sum(by.values())
    rows = [{"storage format": DTYPE_NAMES.get(k, k), "dtype": k, "bytes": v, "readable": human(v, "B"),
             "share": f"{100 * v / total:.1f}%"} for k, v in sorted(by.items(), key=lambda kv: -kv[1])]
    return pd.DataFrame(rows)


def bytes_by_kind(acc: Accounting) -> pd.DataFrame:
    rows = [{"module kind": k, "bytes": v, "readable": human(v, "B"), "parameters": acc.params_by_kind[k]}
            for k, v in acc.bytes_by_kind.items() if v]
    return pd.DataFrame(rows).sort_values("bytes", ascending=False, ignore_index=True)


def kv_figure(acc: Accounting) -> go.Figure:
    kv = acc.to_json()["kv_bytes_per_token"]["layers"]
    fig = go.Figure()
    for key, name, colour in (("window", "window ring (held ≤ window tokens)", "#9ca3af"),
                              ("compressed", "compressed KV (grows with context)", "#3b6ea5"),
                              ("index_keys", "index keys (grows with context)", "#c8741c")):
        fig.add_bar(x=[short_layer(r["layer"]) for r in kv], y=[r[key] for r in kv], name=name, marker_color=colour)
    fig.update_layout(barmode="stack", height=360, margin=dict(l=10, r=10, t=64, b=10), yaxis_title="bytes per token",
                      xaxis=dict(title="layer", type="category"), legend=LEGEND_ABOVE,
                      title=dict(text=f"global (context-growing) KV: {acc.kv_global_per_token:g} B per token",
                                 font=dict(size=13), yref="container", y=0.98, yanchor="top"))
    return fig


def short_layer(path: str) -> str:
    """'layers.12' → '12', 'mtp.0' → 'mtp0': tick labels that fit side by side."""
    return path.removeprefix("layers.").replace("mtp.", "mtp")


def role_table(args: ModelArgs) -> pd.DataFrame:
    rows = []
    for r in args.roles:
        rows.append({"layer": r.path, "ratio": r.ratio, "attention": r.attn_kind,
                     "rope": f"{r.rope_base:g}" + (" + YaRN" if r.yarn else ""),
                     "KV": {"window": "window only", "own": "own compressor"}.get(
                         r.kv_mode, f"reads layer {r.kv_source}"),
                     "indexer": {"none": "–", "own": "own keys + query",
                                 "reindex": f"Reindex (keys of {r.index_key_source})",
                                 "reuse": f"reuses layer {r.index_source}"}[r.indexer],
                     "other": ", ".join(x for x, on in (("candidate source", r.candidate_source),
                                                        ("within candidates", r.uses_candidates),
                                                        ("Engram", r.engram), ("DSpark tap", r.tapped),
                                                        ("hash-routed", r.hash_routed)) if on)})
    return pd.DataFrame(rows)


def experts_touched_figure(args: ModelArgs, measured: dict[int, float] | None = None) -> go.Figure:
    """Expected distinct experts read by a batch of B tokens, E·(1−(1−k/E)^B), per MoE kind in the model."""
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    fig = go.Figure()
    curves = [("backbone", args.n_routed_experts, args.n_activated_experts)]
    if args.has_dspark and args.dspark_n_routed_experts:
        curves.append(("drafter", args.draft_n_routed_experts, args.draft_n_activated_experts))
    for name, e, k in curves:
        fig.add_scatter(x=batches, y=[expected_touched(e, k, b) for b in batches], mode="lines+markers",
                        name=f"{name}: E={e}, k={k} (closed form)")
    if measured:
        fig.add_scatter(x=list(measured), y=list(measured.values()), mode="markers", name="measured (trace)")
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(type="log", title="tokens in batch B", tickvals=batches),
                      yaxis_title="distinct experts read per layer", legend=LEGEND_ABOVE)
    return fig
