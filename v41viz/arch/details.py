"""Everything the details panel shows for one node: explanation, role, tensors and sizes (no streamlit)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx
import pandas as pd

from engine.spec.config import ModelArgs

from .folding import LayerGroup, group_of
from .module_docs import ModuleDoc, describe
from .source import ENGINE_CODE
from .substep_docs import describe_step
from .substeps import Step

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
    shapes: tuple[tuple[str, str, str], ...] = ()   # (in / out, what, shape) of a step of an opened box
    code: tuple[str, ...] = ()     # the engine functions / classes / methods that compute it
    reads: str = ""                # a Reuse step: the other layer's module it reads


def node_details(args: ModelArgs, g: nx.DiGraph, groups: list[LayerGroup], node: str,
                 expanded: frozenset[str] = frozenset(), steps: dict[str, Step] | None = None) -> NodeDetails:
    """expanded: ids of the folded groups the diagram currently draws layer by layer; steps: the steps of the
    opened boxes by id (substeps.step_index), for the nodes that are steps rather than graph modules."""
    step = (steps or {}).get(node)
    if node not in g:
        if step is None:
            raise KeyError(f"'{node}' is not a module of this model")
        return _step_details(args, g, groups, step, expanded)
    d = g.nodes[node]
    role = d["role"]
    role_line, group_line = _role_lines(role, groups, expanded)
    return NodeDetails(node, d["kind"], d["type"], describe(d["type"], args, role), d.get("params"), d.get("bytes"),
                       role_line, group_line, tensor_table(g, node) if "tensors" in d else None,
                       _shape_rows(step), ENGINE_CODE.get(d["type"], ()))


def _role_lines(role, groups: list[LayerGroup], expanded: frozenset[str]) -> tuple[str, str]:
    if role is None:
        return "", ""
    role_line = f"{role.path}: {role.summary}; RoPE base {role.rope_base:g}" + (" + YaRN" if role.yarn else "") + "."
    gr = group_of(groups, role.layer)
    group_line = ""
    if len(gr.layers) > 1:
        kind = f"×{gr.repeats}" + (" alternating pairs" if gr.period == 2 else " identical layers")
        group_line = (f"Drawn layer by layer: its group, layers {gr.span} ({kind}), is expanded."
                      if gr.id in expanded else f"Drawn folded with layers {gr.span} ({kind}).")
    return role_line, group_line


def _step_details(args: ModelArgs, g: nx.DiGraph, groups: list[LayerGroup], step: Step,
                  expanded: frozenset[str]) -> NodeDetails:
    """A step that is not a checkpoint module of its own: its tensors are the parent's it computes with."""
    parent = g.nodes[step.parent]
    role = parent["role"]
    mine = [t for t in parent.get("tensors", ()) if any(t.name == f"{step.parent}.{m}" or
                                                        t.name.startswith(f"{step.parent}.{m}.") for m in step.owns)]
    role_line, group_line = _role_lines(role, groups, expanded)
    return NodeDetails(step.id, step.kind, f"step:{step.name}", describe_step(step.name, args, role),
                       sum(t.params for t in mine), sum(t.nbytes for t in mine), role_line, group_line,
                       tensor_rows(mine) if "tensors" in parent else None, _shape_rows(step), step.code, step.reads)


def _shape_rows(step: Step | None) -> tuple[tuple[str, str, str], ...]:
    if step is None:
        return ()
    return tuple(("in", what, shape) for what, shape in step.inputs) + \
        tuple(("out", what, shape) for what, shape in step.outputs)


def subtree(g: nx.DiGraph, node: str) -> list[str]:
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(c for c in g.successors(n) if g.edges[n, c]["kind"] == "part")
    return out


def tensor_table(g: nx.DiGraph, node: str) -> pd.DataFrame:
    """The node's checkpoint tensors (its submodules' included); routed experts fold into one row per name."""
    return tensor_rows([t for n in subtree(g, node) for t in g.nodes[n]["tensors"]])


def tensor_rows(tensors) -> pd.DataFrame:
    """Tensor specs as table rows: name, shape, dtype, count, params, bytes; routed experts fold into one row per
    name."""
    rows: dict[str, dict] = {}
    for t in tensors:
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
