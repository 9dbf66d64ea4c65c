"""Place the diagram's boxes: the folded layer stack, the inside of the focused layer, and the drafter."""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from engine.spec.config import ModelArgs

from .folding import LayerGroup

# Column centres and widths in diagram units (y grows downwards; the figure flips it).
STACK_X, STACK_W = 0.0, 3.8
ENGRAM_X, ENGRAM_W = 3.05, 1.6
DRAFT_X, DRAFT_W = -4.6, 3.0
DETAIL_X, DETAIL_W = 6.2, 3.4
SIDE_X, SIDE_W = 9.55, 2.5
BOX_H, PITCH = 0.74, 1.12


@dataclass
class Box:
    key: str            # unique within the figure, e.g. "stack:layers.3-7" or "detail:layers.3.attn"
    node: str           # the graph node a click selects
    x: float
    y: float
    w: float
    h: float
    kind: str
    title: str
    subtitle: str = ""
    badge: str = ""     # "×5" on a folded group
    stacked: bool = False  # draw as a pile of cards (a folded group)
    dim: bool = False   # a submodule box (smaller text)


@dataclass
class Edge:
    a: str              # Box keys
    b: str
    kind: str           # flow | residual | aux | tap
    label: str = ""


@dataclass
class Layout:
    boxes: dict[str, Box] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    focus_layer: int = 0
    focus_key: str = ""          # the stack box the detail column zooms into
    detail_frame: tuple[float, float, float, float] = (0, 0, 0, 0)   # x0, y0, x1, y1
    detail_title: str = ""
    height: float = 0.0

    def add(self, box: Box) -> str:
        self.boxes[box.key] = box
        return box.key


def layer_title(g: nx.DiGraph, path: str) -> str:
    return g.nodes[path]["label"]


def build_layout(args: ModelArgs, g: nx.DiGraph, groups: list[LayerGroup], expanded: set[str],
                 focus_layer: int, fmt_params=None) -> Layout:
    """fmt_params(node_id) → short size text for a box, or None when accounting is unavailable."""
    lay = Layout(focus_layer=focus_layer)
    size = fmt_params or (lambda _nid: "")
    y = 0.0

    def stack_box(node: str, title: str, subtitle: str, kind: str, **kw) -> str:
        nonlocal y
        key = lay.add(Box(f"stack:{kw.pop('key', node)}", node, STACK_X, y, STACK_W, BOX_H, kind, title, subtitle, **kw))
        y += PITCH
        return key

    order = [stack_box("embed", "Token embedding", f"{args.vocab_size:,} × {args.dim}", "embedding")]
    backbone = [gr for gr in groups if not gr.draft]
    for gr in backbone:
        if gr.repeats > 1 and gr.id not in expanded:
            first = f"layers.{gr.first}"
            sub = "  /  ".join(gr.variants) if gr.period > 1 else gr.variants[0]
            key = stack_box(first, f"layers {gr.span}",
                            sub, "norm", key=gr.id,
                            badge=f"×{gr.repeats}" + (" pairs" if gr.period == 2 else ""), stacked=True)
            order.append(key)
            _side_engram(lay, g, args, gr.layers, key)
            if focus_layer in gr.layers:
                lay.focus_key = key
            continue
        for layer in gr.layers:
            path = f"layers.{layer}"
            key = stack_box(path, f"layer {layer}", g.nodes[path]["role"].summary, "norm")
            order.append(key)
            _side_engram(lay, g, args, (layer,), key)
            if layer == focus_layer:
                lay.focus_key = key
    if "hc_head" in g:
        order.append(stack_box("hc_head", "mHC head", "collapse 4 streams", "norm"))
    order.append(stack_box("norm", "Final RMSNorm", f"eps {args.norm_eps:g}", "norm"))
    order.append(stack_box("head", "LM head", f"{args.dim} → {args.vocab_size:,}", "embedding"))
    for a, b in zip(order, order[1:]):
        lay.edges.append(Edge(a, b, "flow"))
    stack_bottom = y

    draft_bottom = _drafter(lay, g, args, groups, size)
    detail_bottom = _detail(lay, g, args, focus_layer, groups, size)
    lay.height = max(stack_bottom, draft_bottom, detail_bottom)
    return lay


def _side_engram(lay: Layout, g: nx.DiGraph, args: ModelArgs, layers, stack_key: str) -> None:
    eng = [l for l in layers if f"layers.{l}.engram" in g]
    if not eng:
        return
    sb = lay.boxes[stack_key]
    node = f"layers.{eng[0]}.engram"
    key = lay.add(Box(f"side:{node}", node, ENGRAM_X, sb.y, ENGRAM_W, BOX_H * 0.8, "auxiliary", "Engram",
                      f"layer {eng[0]}", dim=True))
    lay.edges.append(Edge(key, stack_key, "aux"))


def _drafter(lay: Layout, g: nx.DiGraph, args: ModelArgs, groups, size) -> float:
    if not args.n_draft_stages:
        return 0.0
    taps = [b for b in lay.boxes.values() if b.key.startswith("stack:layers")
            and any(g.nodes[f"layers.{l}"]["role"].tapped for l in _layers_of(b, groups))]
    last_layer_box = [b for b in lay.boxes.values() if b.key.startswith("stack:layers")][-1]
    anchor = taps[0] if taps else last_layer_box
    y = max(anchor.y - PITCH, 0.0)
    keys = []

    def box(node: str, title: str, subtitle: str, kind: str = "auxiliary") -> str:
        nonlocal y
        key = lay.add(Box(f"draft:{node}", node, DRAFT_X, y, DRAFT_W, BOX_H, kind, title, subtitle))
        keys.append(key)
        y += PITCH
        return key

    if args.has_dspark:
        proj = box("mtp.0.main_proj", "main_proj", f"{len(args.dspark_target_layer_ids)}×{args.dim} → {args.dim}")
        box("mtp.0.main_norm", "main_norm", "RMSNorm")
        for t in taps:
            lay.edges.append(Edge(t.key, proj, "tap", "tap"))
    for s in range(args.n_draft_stages):
        node = f"mtp.{s}"
        box(node, g.nodes[node]["label"], f"{args.draft_n_routed_experts} experts, top-{args.draft_n_activated_experts}")
    if args.has_dspark:
        last = f"mtp.{args.n_draft_stages - 1}"
        box(f"{last}.norm", "draft norm", "→ shared LM head")
        box(f"{last}.markov_head", "Markov head", f"rank {args.dspark_markov_rank}")
        box(f"{last}.confidence_head", "Confidence head", f"{args.dim}+{args.dspark_markov_rank} → 1")
    else:
        lay.edges.append(Edge(last_layer_box.key, keys[0], "tap", "last state"))
    for a, b in zip(keys, keys[1:]):
        lay.edges.append(Edge(a, b, "flow"))
    return y


def _layers_of(box: Box, groups) -> tuple[int, ...]:
    ident = box.key.removeprefix("stack:")
    for gr in groups:
        if gr.id == ident:
            return gr.layers
    return (int(box.node.split(".")[1]),)


def _detail(lay: Layout, g: nx.DiGraph, args: ModelArgs, layer: int, groups, size) -> float:
    role = args.roles[layer]
    p = role.path
    anchor = lay.boxes.get(lay.focus_key) or lay.boxes.get(f"draft:{p}")
    rows = (["engram"] if role.engram else []) + ["hc_attn", "attn_norm", "attn", "", "hc_ffn", "ffn_norm", "ffn", "", ""]
    top = max(0.0, (anchor.y if anchor else 0.0) - 1.5)
    y, keys = top + 0.9, []
    for part in rows:
        if part:
            node = f"{p}.{part}"
            d = g.nodes[node]
            keys.append(lay.add(Box(f"detail:{node}", node, DETAIL_X, y, DETAIL_W, BOX_H, d["kind"], d["label"],
                                    size(node))))
        y += PITCH * (0.85 if part else 0.7)
    for a, b in zip(keys, keys[1:]):
        lay.edges.append(Edge(a, b, "flow"))
    lay.edges.append(Edge(f"detail:{p}.hc_attn", f"detail:{p}.hc_ffn", "residual", "residual streams"))
    for parent in ("attn", "ffn"):
        kids = [c for c in g.successors(f"{p}.{parent}") if g.edges[f"{p}.{parent}", c]["kind"] == "part"]
        py = lay.boxes[f"detail:{p}.{parent}"].y
        for i, kid in enumerate(kids):
            d = g.nodes[kid]
            key = lay.add(Box(f"detail:{kid}", kid, SIDE_X, py + i * 0.78, SIDE_W, 0.62, d["kind"], d["label"],
                              size(kid), dim=True))
            lay.edges.append(Edge(f"detail:{p}.{parent}", key, "aux"))
    gr = next(gr for gr in groups if layer in gr.layers)
    many = f" (one of {len(gr.layers)}: layers {gr.span})" if len(gr.layers) > 1 else ""
    lay.detail_title = f"inside {p}{many}"
    lay.detail_frame = (DETAIL_X - DETAIL_W / 2 - 0.45, top, SIDE_X + SIDE_W / 2 + 0.25, y + 0.1)
    return y + 0.2

