"""A diagram node the model to run lacks (layer 14 of a 43-layer diagram on an 8-layer model): say why, and find
the nearest layer of the same kind in the model to run (the nearest Engram layer for an Engram module)."""
from __future__ import annotations

import re

from engine.spec.roles import LayerRole, layer_roles

NODE = re.compile(r"(layers|mtp)\.([0-9]{1,6})((?:\.[A-Za-z_][A-Za-z0-9_]*)*)", re.ASCII)
KIND = {"engram": "Engram layer", "attn": "layer with the same attention kind",
        "ffn": "MoE layer of the same routing kind", "hc_attn": "layer", "hc_ffn": "layer"}


def parse_node(node: str) -> tuple[str, int, str] | None:
    """('layers' | 'mtp', index, '.rest') of a dotted layer path, or None for anything else."""
    m = NODE.fullmatch(node)
    return None if m is None else (m.group(1), int(m.group(2)), m.group(3))


def missing_reason(node: str, args, model: str) -> str | None:
    """Why the model to run has no such node (a sentence), or None when it has it."""
    parsed = parse_node(node)
    if parsed is None:
        return None
    group, i, rest = parsed
    if group == "mtp":
        if i < args.n_draft_stages:
            return None
        return (f"the model to run ({model}) has {args.n_draft_stages} draft stage(s), so no `mtp.{i}`"
                if args.n_draft_stages else f"the model to run ({model}) has no draft stages")
    if i >= args.n_layers:
        return f"the model to run ({model}, {args.n_layers} layers) has no layer {i}"
    if rest.split(".")[1:2] == ["engram"] and not layer_roles(args)[i].engram:
        return f"layer {i} of the model to run ({model}) has no Engram module"
    return None


def nearest_equivalent(node: str, args, source=None) -> str | None:
    """The same kind of node in the model to run (args). With source (the ModelArgs of the diagram the node came
    from), the layer of the same rank among the layers of its kind (the 2nd of 2 Engram layers maps to the 2nd
    Engram layer); without it, the layer of that kind whose number is nearest."""
    parsed = parse_node(node)
    if parsed is None:
        return None
    group, i, rest = parsed
    if group == "mtp":
        return f"mtp.{args.n_draft_stages - 1}{rest}" if args.n_draft_stages else None
    leaf = rest.split(".")[1] if rest else ""
    roles = [r for r in layer_roles(args) if not r.draft]
    theirs = _role(source, i)
    candidates = [r for r in roles if _same_kind(leaf, r, theirs)]
    if leaf == "engram" and not candidates:
        return None
    candidates = candidates or roles
    peers = [] if theirs is None else [r.layer for r in layer_roles(source)
                                       if not r.draft and _same_kind(leaf, r, theirs)]
    if i in peers:
        rank = peers.index(i) / (len(peers) - 1) if len(peers) > 1 else 0.0   # 0 = first of its kind, 1 = last
        return f"layers.{candidates[round(rank * (len(candidates) - 1))].layer}{rest}"
    best = min(candidates, key=lambda r: (abs(r.layer - i), r.layer))
    return f"layers.{best.layer}{rest}"


def kind_name(node: str) -> str:
    parsed = parse_node(node)
    leaf = parsed[2].split(".")[1] if parsed and parsed[2] else ""
    return "draft stage" if parsed and parsed[0] == "mtp" else KIND.get(leaf, "layer")


def _role(source, i: int) -> LayerRole | None:
    if source is None:
        return None
    roles = layer_roles(source)
    return roles[i] if i < source.n_layers else None


def _same_kind(leaf: str, mine: LayerRole, theirs: LayerRole | None) -> bool:
    if leaf == "engram":
        return mine.engram
    if theirs is None:
        return True
    if leaf == "attn":
        return mine.ratio == theirs.ratio
    if leaf == "ffn":
        return mine.hash_routed == theirs.hash_routed
    return True
