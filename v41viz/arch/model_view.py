"""Everything the architecture page derives from one config, built once per config and cached by the page."""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from engine.accounting.accounting import Accounting, account
from engine.accounting.inventory import inventory_tuple
from engine.spec.config import ModelArgs

from .details import human
from .folding import LayerGroup, fold_layers
from .graph import attach_inventory, build_graph


@dataclass
class ModelView:
    args: ModelArgs
    graph: nx.DiGraph
    groups: list[LayerGroup]
    accounting: Accounting
    orphans: list[str]      # inventory tensors no diagram node owns (expected: none)

    @property
    def foldable(self) -> list[LayerGroup]:
        return [g for g in self.groups if g.repeats > 1]

    def size_text(self, node: str) -> str:
        p = self.graph.nodes[node].get("params")
        return f"{human(p)} params" if p else ""  # detail boxes: the size is the subtitle

    def hover_text(self, node: str, summary: str) -> str:
        d = self.graph.nodes[node]
        sizes = f"{human(d.get('params'))} params · {human(d.get('bytes'), 'B')}" if d.get("params") else ""
        return "\n".join(x for x in (d["label"], summary, sizes) if x)

    def default_focus(self) -> int:
        """The first layer that publishes compressed KV shows the most machinery; else layer 0."""
        return next((r.layer for r in self.args.roles if r.kv_mode == "own"), 0)


def context_length(args: ModelArgs) -> tuple[int, str]:
    """The longest sequence the config describes, and where that number comes from: the HF
    max_position_embeddings when set, else the larger of the YaRN-extended window and the runtime max_seq_len."""
    if args.max_position_embeddings:
        return args.max_position_embeddings, "max_position_embeddings"
    yarn = int(args.original_seq_len * args.rope_factor) if args.rope_factor > 1 else 0
    if yarn > args.max_seq_len:
        return yarn, f"YaRN: original_seq_len {args.original_seq_len:,} × rope_factor {args.rope_factor:g}"
    return args.max_seq_len, "max_seq_len (the engine's runtime limit)"


def build_view(args: ModelArgs) -> ModelView:
    g = build_graph(args)
    orphans = attach_inventory(g, inventory_tuple(args))
    return ModelView(args, g, fold_layers(args.roles, args.n_layers), account(args), orphans)
