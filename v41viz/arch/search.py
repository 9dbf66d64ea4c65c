"""Find modules by path or label ('layers.12.attn', 'indexer', 'engram', 'q low-rank'): every graph node and every
step of the opened boxes, best match first."""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from engine.spec.config import ModelArgs

from .substeps import Step, step_index


@dataclass
class ModuleIndex:
    """Everything a person can select on the diagram of one model: graph modules and the steps of opened boxes."""
    steps: dict[str, Step]                 # every step by id (substeps.step_index)
    entries: list[tuple[str, str]]         # (id, label) in reading order
    labels: dict[str, str] = field(init=False)

    def __post_init__(self):
        self.labels = dict(self.entries)

    def __contains__(self, node: object) -> bool:
        return node in self.labels

    def find(self, query: str) -> list[str]:
        return find_modules(self.entries, query)


def build_index(args: ModelArgs, g: nx.DiGraph) -> ModuleIndex:
    steps = step_index(args)
    return ModuleIndex(steps, module_index(g, steps))


def module_index(g: nx.DiGraph, steps: dict[str, Step]) -> list[tuple[str, str]]:
    """(id, label) of every selectable module in reading order: each attention or MoE module followed by the steps
    that are not graph nodes of their own."""
    by_parent: dict[str, list[Step]] = {}
    for st in steps.values():
        if st.id not in g:
            by_parent.setdefault(st.parent, []).append(st)
    out = []
    for n in g:
        out.append((n, g.nodes[n]["label"]))
        out += [(st.id, st.title) for st in by_parent.get(n, ())]
    return out


def find_modules(index: list[tuple[str, str]], query: str) -> list[str]:
    """Ids whose path and label together contain every word of the query (case-insensitive), ranked: the exact
    path, then paths that start with the query, then a word equal to a path segment, then the rest; reading
    order within a rank."""
    q = query.strip().lower()
    words = q.split()
    if not words:
        return []
    ranked = []
    for order, (node, label) in enumerate(index):
        path = node.lower()
        text = f"{path} {label.lower()}"
        if not all(w in text for w in words):
            continue
        segments = set(path.split("."))
        rank = 0 if path == q else 1 if path.startswith(q) else 2 if any(w in segments for w in words) else 3
        ranked.append((rank, order, node))
    return [node for _, _, node in sorted(ranked)]
