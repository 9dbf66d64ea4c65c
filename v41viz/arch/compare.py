"""Two configs side by side: sizes, mechanisms present, layer roles and the config fields that differ."""
from __future__ import annotations

import pandas as pd

from engine.accounting.accounting import account
from engine.spec.config import ModelArgs

from .details import human
from .folding import fold_layers


def mechanisms(a: ModelArgs) -> dict[str, str]:
    ratios = sorted({r for r in a.compress_ratios[: a.n_layers] if r})
    return {
        "family": a.family,
        "KV compression ratios": "/".join(map(str, ratios)) or "none",
        "compressed KV": (f"shared: sources {list(a.kv_source_layers)}" if a.kv_source_layers
                          else "per layer (every compressed layer owns a compressor)" if ratios else "none"),
        "index sources": (str(list(a.index_source_layers)) if a.index_source_layers
                          else "own indexer in every ratio-4 layer" if 4 in ratios else "none"),
        "candidate filter (two-level top-k)": (f"layer {a.candidate_source_layer}: {a.candidate_topk_blocks} blocks × "
                                               f"{a.candidate_block_size}"
                                               if a.candidate_source_layer >= 0 else "absent"),
        "Engram": f"layers {list(a.engram_layer_ids)}" if a.has_engram else "absent",
        "hash-routed layers": str(a.n_hash_layers) if a.n_hash_layers else "none",
        "mHC final collapse": "learned hc_head" if a.family == "v4" else "single-pass pre chain (no hc_head)",
        "drafter": (f"DSpark: {a.n_draft_stages} stages, taps {list(a.dspark_target_layer_ids)}, "
                    f"{a.draft_n_routed_experts} experts top-{a.draft_n_activated_experts}" if a.has_dspark
                    else f"{a.n_draft_stages} MTP layer(s)" if a.n_draft_stages else "none"),
        "vision tower": f"{a.vision_n_layers}-layer ViT" if a.vision_n_layers else "absent",
        "weights": f"{a.dtype} (block {list(a.weight_block_size)}), experts {a.expert_dtype or a.dtype}",
    }


def sizes(a: ModelArgs) -> dict[str, str]:
    acc = account(a).to_json()
    return {
        "hidden size": str(a.dim), "backbone layers": str(a.n_layers), "attention heads": str(a.n_heads),
        "q LoRA rank": str(a.q_lora_rank), "indexer heads": str(a.index_n_heads),
        "routed experts / top-k": f"{a.n_routed_experts} / {a.n_activated_experts}",
        "expert width": str(a.moe_inter_dim), "norm eps": f"{a.norm_eps:g}",
        "total parameters": human(acc["params"]["total"]), "backbone parameters": human(acc["params"]["backbone"]),
        "activated per decode token": human(acc["params"]["activated_decode"]),
        "activated per prefill token": human(acc["params"]["activated_prefill"]),
        "checkpoint bytes": human(acc["bytes"]["checkpoint"], "B"),
        "global KV bytes per token": f"{acc['kv_bytes_per_token']['global']:g} B",
        "checkpoint tensors": f"{acc['n_tensors']:,}",
    }


def side_by_side(a: ModelArgs, b: ModelArgs) -> pd.DataFrame:
    """Rows: quantity, A, B, differs."""
    rows = []
    for section, fa, fb in (("size", sizes(a), sizes(b)), ("mechanism", mechanisms(a), mechanisms(b))):
        for k in fa:
            rows.append({"section": section, "quantity": k, "A": fa[k], "B": fb[k], "differs": fa[k] != fb[k]})
    return pd.DataFrame(rows)


def role_diff(a: ModelArgs, b: ModelArgs) -> pd.DataFrame:
    """One row per layer position (backbone, then draft stages): each config's role and whether they match."""
    def by_pos(x: ModelArgs) -> list[tuple[str, str]]:
        return [(r.path, r.summary) for r in x.roles]
    ra, rb = by_pos(a), by_pos(b)
    rows = []
    for i in range(max(len(ra), len(rb))):
        pa, sa = ra[i] if i < len(ra) else ("", "—")
        pb, sb = rb[i] if i < len(rb) else ("", "—")
        rows.append({"A layer": pa, "A role": sa, "B layer": pb, "B role": sb, "differs": (pa, sa) != (pb, sb)})
    return pd.DataFrame(rows)


def folded_stack(a: ModelArgs) -> pd.DataFrame:
    groups = fold_layers(a.roles, a.n_layers)
    return pd.DataFrame([{"group": g.label, "role": "  /  ".join(g.variants)} for g in groups])


def field_diff(a: ModelArgs, b: ModelArgs) -> pd.DataFrame:
    da, db = a.to_dict(), b.to_dict()
    rows = [{"field": k, "A": _short(da[k]), "B": _short(db[k])} for k in da if k != "name" and da[k] != db[k]]
    return pd.DataFrame(rows, columns=["field", "A", "B"])


def _short(v) -> str:
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "…"
