"""Everything the details panel shows for one node: explanation, role, tensors and sizes (no streamlit)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx
import pandas as pd

from engine.spec.config import ModelArgs

from .folding import LayerGroup, group_of
from .module_docs import ModuleDoc, describe

EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True)
class NodeDetails:
    node: str
    kind: str
    type: str
    doc: ModuleDoc
    params: int | None
    nbytes: int | None
    role_line: str
    group_line: str
    tensors: pd.DataFrame | None   # name, shape, dtype, count, params, bytes (experts folded)


def node_details(args: ModelArgs, g: nx.DiGraph, groups: list[LayerGroup], node: str,
                 expanded: frozenset[str] = frozenset()) -> NodeDetails:
    """expanded: ids of the folded groups the diagram currently draws layer by layer."""
    if node not in g:
        raise KeyError(f"'{node}' is not a module of this model")
    d = g.nodes[node]
    role = d["role"]
    role_line = group_line = ""
    if role is not None:
        role_line = f"{role.path}: {role.summary}; RoPE base {role.rope_base:g}" + (" + YaRN" if role.yarn else "") + "."
        gr = group_of(groups, role.layer)
        if len(gr.layers) > 1:
            kind = f"×{gr.repeats}" + (" alternating pairs" if gr.period == 2 else " identical layers")
            group_line = (f"Drawn layer by layer: its group, layers {gr.span} ({kind}), is expanded."
                          if gr.id in expanded else f"Drawn folded with layers {gr.span} ({kind}).")
    return NodeDetails(node, d["kind"], d["type"], describe(d["type"], args, role), d.get("params"), d.get("bytes"),
                       role_line, group_line, tensor_table(g, node) if "tensors" in d else None)


def subtree(g: nx.DiGraph, node: str) -> list[str]:
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(c for c in g.successors(n) if g.edges[n, c]["kind"] == "part")
    return out


def tensor_table(g: nx.DiGraph, node: str) -> pd.DataFrame:
    """The node's checkpoint tensors (its submodules' included); routed experts fold into one row per name."""
    rows: dict[str, dict] = {}
    for n in subtree(g, node):
        for t in g.nodes[n]["tensors"]:
            name = EXPERT_INDEX.sub(".experts.{i}.", t.name)
            r = rows.setdefault(name, {"tensor": name, "shape": str(list(t.shape)), "dtype": t.dtype,
                                       "count": 0, "params": 0, "bytes": 0})
            r["count"] += 1
            r["params"] += t.params
            r["bytes"] += t.nbytes
    return pd.DataFrame(list(rows.values()), columns=["tensor", "shape", "dtype", "count", "params", "bytes"])


def display_table(table: pd.DataFrame, node: str) -> pd.DataFrame:
    """Names relative to the node ('wk.weight', '_fn') and readable sizes, for a narrow panel."""
    out = table.copy()
    out["tensor"] = [t[len(node):].lstrip(".") if t.startswith(node) else t for t in out["tensor"]]
    out["params"] = [human(v) for v in out["params"]]
    out["bytes"] = [human(v, "B") for v in out["bytes"]]
    return out.rename(columns={"count": "×"})


def human(n: float | None, unit: str = "") -> str:
    """1234567 → '1.23M'; bytes use binary units when unit == 'B'."""
    if n is None:
        return "–"
    if unit == "B":
        for suffix, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(n) >= scale:
                return f"{n / scale:.2f} {suffix}"
        return f"{n:.0f} B"
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}"
    return f"{n:.0f}"
