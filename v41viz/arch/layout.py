"""Place the diagram's boxes: the folded layer stack, the inside of the focused layer (its attention and MoE opened
into their steps when asked), and the drafter; the arrows carry the shapes of what flows along them."""
from __future__ import annotations

import networkx as nx

from engine.spec.config import ModelArgs

from .boxes import Box, Edge, Layout
from .folding import LayerGroup
from .layout_open import place_opened
from .shapes import Shapes
from .substeps import OPENABLE

__all__ = ["Box", "Edge", "Layout", "build_layout"]

# Column centres and widths in diagram units (y grows downwards; the figure flips it).
STACK_X, STACK_W = 0.0, 3.8
ENGRAM_X, ENGRAM_W = 3.05, 1.6
DRAFT_X, DRAFT_W = -4.6, 3.0
DETAIL_X, DETAIL_W = 6.2, 3.8
SIDE_X, SIDE_W = 9.75, 2.5
BOX_H, PITCH = 0.74, 1.12


def build_layout(args: ModelArgs, g: nx.DiGraph, groups: list[LayerGroup], expanded: set[str],
                 focus_layer: int, fmt_params=None, opened: frozenset[str] = frozenset()) -> Layout:
    """fmt_params(node_id) → short size text for a box, or None when accounting is unavailable. opened: 'attn'
    and/or 'ffn', the focused layer's boxes drawn opened into their steps."""
    lay = Layout(focus_layer=focus_layer, opened=frozenset(opened))
    size = fmt_params or (lambda _nid: "")
    shapes = Shapes(args)
    y = 0.0

    def stack_box(node: str, title: str, subtitle: str, kind: str, **kw) -> str:
        nonlocal y
        key = lay.add(Box(f"stack:{kw.pop('key', node)}", node, STACK_X, y, STACK_W, BOX_H, kind, title, subtitle,
                          **kw))
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
                            badge=f"×{gr.repeats}" + (" pairs" if gr.period == 2 else ""), stacked=True,
                            covers=tuple(f"layers.{i}" for i in gr.layers))
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
    lay.edges.append(Edge("@in", order[0], "flow", f"ids {shapes.ids}", "in"))
    for a, b in zip(order, order[1:]):
        carries = shapes.hidden if lay.boxes[b].node == "head" or lay.boxes[a].node == "hc_head" else shapes.streams
        lay.edges.append(Edge(a, b, "flow", carries))
    lay.edges.append(Edge(order[-1], "@out", "flow", f"logits {shapes.logits}", "out"))
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
    shapes = Shapes(args)
    taps = [b for b in lay.boxes.values() if b.key.startswith("stack:layers")
            and any(g.nodes[f"layers.{l}"]["role"].tapped for l in _layers_of(b, groups))]
    last_layer_box = [b for b in lay.boxes.values() if b.key.startswith("stack:layers")][-1]
    anchor = taps[0] if taps else last_layer_box
    y = max(anchor.y - PITCH, 0.0)
    keys, carries = [], []

    def box(node: str, title: str, subtitle: str, out: str, kind: str = "auxiliary") -> str:
        nonlocal y
        key = lay.add(Box(f"draft:{node}", node, DRAFT_X, y, DRAFT_W, BOX_H, kind, title, subtitle))
        keys.append(key)
        carries.append(out)
        y += PITCH
        return key

    if args.has_dspark:
        proj = box("mtp.0.main_proj", "main_proj", f"{len(args.dspark_target_layer_ids)}×{args.dim} → {args.dim}",
                   shapes.hidden)
        box("mtp.0.main_norm", "main_norm", "RMSNorm", f"main_x {shapes.hidden}")
        for t in taps:
            lay.edges.append(Edge(t.key, proj, "tap"))
    last = args.n_draft_stages - 1
    for s in range(args.n_draft_stages):
        node = f"mtp.{s}"
        out = shapes.draft_hidden if args.has_dspark and s == last else shapes.draft_streams
        box(node, g.nodes[node]["label"],
            f"{args.draft_n_routed_experts} experts, top-{args.draft_n_activated_experts}",
            out if args.has_dspark else shapes.streams)
    if args.has_dspark:
        stage = f"mtp.{last}"
        box(f"{stage}.norm", "draft norm", "→ shared LM head", f"base logits {shapes.draft_logits}")
        box(f"{stage}.markov_head", "Markov head", f"rank {args.dspark_markov_rank}", f"e {shapes.markov_row}")
        box(f"{stage}.confidence_head", "Confidence head", f"{args.dim}+{args.dspark_markov_rank} → 1", "")
    else:
        lay.edges.append(Edge(last_layer_box.key, keys[0], "tap", "last state"))
    for a, b, carried in zip(keys, keys[1:], carries):
        lay.edges.append(Edge(a, b, "flow", carried))
    return y


def _layers_of(box: Box, groups) -> tuple[int, ...]:
    ident = box.key.removeprefix("stack:")
    for gr in groups:
        if gr.id == ident:
            return gr.layers
    return (int(box.node.split(".")[1]),)


def _detail(lay: Layout, g: nx.DiGraph, args: ModelArgs, layer: int, groups, size) -> float:
    """The focused layer, top to bottom in the detail column; an opened attention or MoE box holds its steps, a
    closed one has its submodules beside it."""
    role = args.roles[layer]
    p, shapes = role.path, Shapes(args)
    anchor = lay.boxes.get(lay.focus_key) or lay.boxes.get(f"draft:{p}")
    parts = (["engram"] if role.engram else []) + ["hc_attn", "attn_norm", "attn", "hc_ffn", "ffn_norm", "ffn"]
    out_shape = {"engram": shapes.streams}   # what leaves each part; the rest carry the normed/sublayer width
    top = max(0.0, (anchor.y if anchor else 0.0) - 1.5)
    y = top + 0.9                # the next box's centre
    chain: list[tuple[str, str]] = []   # (key the arrow enters, key it leaves) per part
    for part in parts:
        node = f"{p}.{part}"
        which = OPENABLE.get(g.nodes[node]["type"], "")
        if which in lay.opened:
            box_key, exit_key, bottom = place_opened(lay, args, role, which, node, g.nodes[node]["label"],
                                                     DETAIL_X, y - BOX_H / 2, size)
            chain.append((box_key, exit_key))
            y = bottom + (PITCH - BOX_H) + BOX_H / 2
            continue
        d = g.nodes[node]
        key = lay.add(Box(f"detail:{node}", node, DETAIL_X, y, DETAIL_W, BOX_H, d["kind"], d["label"], size(node),
                          toggle=which))
        chain.append((key, key))
        kids = [c for c in g.successors(node) if g.edges[node, c]["kind"] == "part"] if which else []
        for i, kid in enumerate(kids):
            k = g.nodes[kid]
            side = lay.add(Box(f"detail:{kid}", kid, SIDE_X, y + i * 0.78, SIDE_W, 0.62, k["kind"], k["label"],
                               size(kid), dim=True))
            lay.edges.append(Edge(key, side, "aux"))
        y += max(PITCH, (len(kids) - 1) * 0.78 + 0.31 + 0.25 + BOX_H / 2) if kids else PITCH
    for (_, leave), (enter, _), part in zip(chain, chain[1:], parts):
        lay.edges.append(Edge(leave, enter, "flow", out_shape.get(part, shapes.hidden), "down"))
    lay.edges.append(Edge(f"detail:{p}.hc_attn", f"detail:{p}.hc_ffn", "residual", "residual streams"))
    gr = next(gr for gr in groups if layer in gr.layers)
    many = f" (one of {len(gr.layers)}: layers {gr.span})" if len(gr.layers) > 1 else ""
    lay.detail_title = f"inside {p}{many}"
    inside = [b for b in lay.boxes.values() if b.key.startswith(("detail:", "open:", "step:"))]
    right = max([SIDE_X + SIDE_W / 2] + [b.right for b in inside])
    bottom = max(b.bottom for b in inside) + 0.3
    lay.detail_frame = (DETAIL_X - DETAIL_W / 2 - 0.45, top, right + 0.25, bottom + 0.1)
    return bottom + 0.2
