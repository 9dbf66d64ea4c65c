"""Two checkpoints on the same statistics: rows matched by (view, module, tensor, layer, axis, index, stat), with
both values and their difference; a statistic only one side has keeps the other side empty."""
from __future__ import annotations

KEY = ("view", "module", "tensor", "layer", "axis", "index", "stat")
COMPARE_COLUMNS = (*KEY, "a", "b", "difference")


def compare_rows(a: list[dict], b: list[dict]) -> list[dict]:
    """One row per statistic of either side: a, b (None where that side lacks it) and b − a (None then too)."""
    left = {tuple(r[k] for k in KEY): r["value"] for r in a}
    right = {tuple(r[k] for k in KEY): r["value"] for r in b}
    out = []
    for key in [*left, *(k for k in right if k not in left)]:
        va, vb = left.get(key), right.get(key)
        out.append({**dict(zip(KEY, key)), "a": va, "b": vb,
                    "difference": None if va is None or vb is None else vb - va})
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per (view, stat): how many statistics both sides have, how many differ, the largest |b − a| and where."""
    groups: dict[tuple[str, str], dict] = {}
    for r in rows:
        g = groups.setdefault((r["view"], r["stat"]), {"view": r["view"], "stat": r["stat"], "both": 0,
                                                       "only_a": 0, "only_b": 0, "differ": 0,
                                                       "max_abs_difference": 0.0, "at": ""})
        if r["difference"] is None:
            g["only_a" if r["b"] is None else "only_b"] += 1
            continue
        g["both"] += 1
        d = abs(r["difference"])
        g["differ"] += d > 0
        if d > g["max_abs_difference"]:
            g["max_abs_difference"], g["at"] = d, f"{r['tensor']}[{r['index']}]" if r["index"] >= 0 else r["tensor"]
    return list(groups.values())
