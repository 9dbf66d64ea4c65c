"""`python -m engine info CONFIG [--json]`: exact accounting, published-vs-exact figures and the layer roles."""
from __future__ import annotations

import argparse
import json

from ..accounting.accounting import GIB, KINDS, Accounting, account
from ..accounting.experts_touched import touched_table
from ..accounting.published_figures import published_figures
from ..spec.config import ModelArgs
from ..spec.presets import resolve_config

HELP = "print parameter, byte and KV-cache accounting and the layer-role table for a config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="path to a config.json, or a preset name from configs/ (e.g. tiny-v4.1)")
    parser.add_argument("--json", action="store_true", help="print the accounting as one JSON object")


def run(args: argparse.Namespace) -> int:
    model = resolve_config(args.config)
    acc = account(model)
    if args.json:
        out = acc.to_json()
        out["published_figures"] = [f.to_dict() for f in published_figures(model)]
        out["roles"] = [r.to_dict() for r in model.roles]
        print(json.dumps(out, indent=1))
        return 0
    print("\n".join(render(model, acc)))
    return 0


def _b(n: float) -> str:
    return f"{n / 1e9:,.3f}B" if n >= 1e8 else f"{n / 1e6:,.3f}M"


def render(model: ModelArgs, acc: Accounting) -> list[str]:
    lines = [f"{model.name or 'model'}: family {model.family}, {acc.n_tensors:,} tensors (vision not counted), "
             f"storage dense={model.dtype} experts={model.expert_dtype or model.dtype}", "",
             "Parameters and bytes by module kind"]
    for kind in KINDS:
        p, b = acc.params_by_kind[kind], acc.bytes_by_kind[kind]
        if p or b:
            lines.append(f"  {kind:<20} {_b(p):>12}  {b / GIB:>9.3f} GiB"
                         + ("  (documented tensors only)" if kind == "vision" else ""))
    lines += [f"  {'total (no vision)':<20} {_b(acc.total_params):>12}  {acc.checkpoint_bytes / GIB:>9.3f} GiB",
              f"  backbone (no Engram tables, drafter, vision): {_b(acc.backbone_params)}; "
              f"one routed expert: {acc.expert_params:,}", "",
              "Activated parameters per token",
              f"  decode                      {_b(acc.activated_decode):>12}",
              f"  prefill (layers {acc.prefill_layers[0]}-{acc.prefill_layers[1]})        "
              f"{_b(acc.activated_prefill):>12}",
              f"  prefill, exact reference    {_b(acc.activated_prefill_exact):>12}"]
    lines += ["  " + rule for rule in acc.to_json()["assumptions"]]
    lines += ["", "Checkpoint bytes by storage dtype"]
    for dtype, n in sorted(acc.bytes_by_dtype.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {dtype:<10} {n / GIB:>10.3f} GiB  ({n:,} B)")
    sources = [f"{l.path} {l.kv_compressed:g}+{l.kv_index:g}" for l in acc.layers if l.kv_compressed or l.kv_index]
    lines += ["", "KV cache per token",
              f"  global (compressed KV + index keys): {acc.kv_global_per_token:g} B"
              + (f" = {', '.join(sources)}" if len(sources) <= 8 else f" from {len(sources)} layers"),
              f"  window: {acc.layers[0].kv_window:g} B per layer x {len(acc.layers)} layers "
              f"({model.n_layers} + {model.n_draft_stages} draft) = {acc.kv_window_per_token:g} B per token, "
              f"for the last {model.window_size} tokens only", "",
              f"Experts touched per step by B tokens (uniform top-{model.n_activated_experts} of "
              f"{model.n_routed_experts}, closed form)"]
    lines.append("  " + "  ".join(f"B={r['batch']}: {r['experts']:.1f} ({100 * r['fraction']:.1f}%)"
                                  for r in touched_table(model.n_routed_experts, model.n_activated_experts)))
    figures = published_figures(model)
    if figures:
        lines += ["", "Published vs exact"]
        for f in figures:
            lines.append(f"  {f.label:<34} exact {f.fmt(f.exact):>12}  published {f.fmt(f.published):>12}  "
                         f"diff {f.fmt(f.difference):>11}")
            lines.append(f"      why: {f.why}")
    lines += ["", "Notes"] + [f"  - {n}" for n in acc.notes]
    lines += ["", "Layer roles", "  " + _row("layer", "ratio", "rope", "YaRN", "KV src", "indexer", "idx src",
                                             "cand", "Engram", "tap", "hash", "params", "activated")]
    for role, la in zip(model.roles, acc.layers):
        lines.append("  " + _row(
            role.path, role.ratio, f"{role.rope_base:g}", "yes" if role.yarn else "-",
            "-" if role.kv_source is None else ("own" if role.kv_mode == "own" else role.kv_source),
            role.indexer, "-" if role.index_source is None else role.index_source,
            "source" if role.candidate_source else ("uses" if role.uses_candidates else "-"),
            "yes" if role.engram else "-", "yes" if role.tapped else "-", "yes" if role.hash_routed else "-",
            _b(la.params), _b(la.activated)))
    return lines


def _row(*cells) -> str:
    widths = (9, 5, 7, 4, 6, 8, 7, 6, 6, 3, 4, 10, 10)
    return " ".join(f"{str(c):>{w}}" for c, w in zip(cells, widths))
