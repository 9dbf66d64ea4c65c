"""The model as a networkx DiGraph built from ModelArgs; node ids are checkpoint module paths."""
from __future__ import annotations

import networkx as nx

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole

# Colour families shown in the legend (kind) and the finer module type that selects the explanation.
KINDS = ("attention", "ffn", "norm", "embedding", "auxiliary")
KIND_OF_TYPE = {
    "embed": "embedding", "head": "embedding", "block": "norm", "rmsnorm": "norm", "mhc": "norm",
    "hc_head": "norm", "attention": "attention", "compressor": "attention", "indexer": "attention",
    "moe": "ffn", "gate": "ffn", "hash_gate": "ffn", "shared_experts": "ffn", "experts": "ffn",
    "engram": "auxiliary", "draft_block": "auxiliary", "main_proj": "auxiliary", "main_norm": "auxiliary",
    "draft_norm": "auxiliary", "markov_head": "auxiliary", "confidence_head": "auxiliary",
}
# Edge kinds: flow (activations), residual (the mHC streams bypassing a sublayer), part (module → its
# submodule), shares (a layer reads another layer's compressed KV or index keys), tap (DSpark input).


def build_graph(args: ModelArgs) -> nx.DiGraph:
    g = nx.DiGraph(name=args.name, family=args.family)
    roles = args.roles

    def node(nid: str, type_: str, label: str, parent: str | None = None, role: LayerRole | None = None) -> str:
        g.add_node(nid, type=type_, kind=KIND_OF_TYPE[type_], label=label, parent=parent,
                   layer=role.layer if role else None, role=role)
        if parent:
            g.add_edge(parent, nid, kind="part")
        return nid

    prev = node("embed", "embed", "Token embedding")
    for role in roles:
        prev = _add_block(g, node, args, role, prev if not role.draft else None)
        if role.layer == args.n_layers - 1:
            backbone_out = prev
    if args.family == "v4":
        backbone_out = _link(g, backbone_out, node("hc_head", "hc_head", "mHC head collapse"))
    final = node("norm", "rmsnorm", "Final RMSNorm")
    _link(g, backbone_out, final)
    _link(g, final, node("head", "head", "LM head"))
    if args.n_draft_stages:
        _add_drafter(g, node, args)
    _add_sharing(g, roles[: args.n_layers])
    return g


def _link(g: nx.DiGraph, a: str, b: str, kind: str = "flow") -> str:
    g.add_edge(a, b, kind=kind)
    return b


def _add_block(g, node, args: ModelArgs, role: LayerRole, prev: str | None) -> str:
    """One backbone layer or draft stage; returns the id of its last module (the FFN)."""
    p = role.path
    title = f"DSpark stage {role.layer - args.n_layers}" if args.has_dspark and role.draft else (
        f"MTP layer {role.layer - args.n_layers}" if role.draft else f"Layer {role.layer}")
    node(p, "draft_block" if role.draft else "block", title, role=role)
    if prev:
        if role.engram:
            prev = _link(g, prev, node(f"{p}.engram", "engram", "Engram", p, role))
    hc_attn = node(f"{p}.hc_attn", "mhc", "mHC (attention site)", p, role)
    if prev:
        _link(g, prev, hc_attn)
    attn_norm = _link(g, hc_attn, node(f"{p}.attn_norm", "rmsnorm", "attn_norm", p, role))
    attn = _link(g, attn_norm, node(f"{p}.attn", "attention", _attn_label(role), p, role))
    if role.kv_mode == "own":
        node(f"{p}.attn.compressor", "compressor", f"Compressor (ratio {role.ratio})", f"{p}.attn", role)
    if role.indexer in ("own", "reindex"):
        node(f"{p}.attn.indexer", "indexer", "Lightning indexer" + (" (Reindex)" if role.indexer == "reindex" else ""),
             f"{p}.attn", role)
    hc_ffn = _link(g, attn, node(f"{p}.hc_ffn", "mhc", "mHC (FFN site)", p, role))
    g.add_edge(hc_attn, hc_ffn, kind="residual")
    ffn_norm = _link(g, hc_ffn, node(f"{p}.ffn_norm", "rmsnorm", "ffn_norm", p, role))
    n_exp = args.draft_n_routed_experts if role.draft else args.n_routed_experts
    k = args.draft_n_activated_experts if role.draft else args.n_activated_experts
    ffn = _link(g, ffn_norm, node(f"{p}.ffn", "moe", f"MoE {n_exp} experts, top-{k}", p, role))
    gate_type = "hash_gate" if role.hash_routed else "gate"
    node(f"{p}.ffn.gate", gate_type, "Hash router (token id)" if role.hash_routed else "Router", f"{p}.ffn", role)
    node(f"{p}.ffn.shared_experts", "shared_experts", f"Shared expert ×{args.n_shared_experts}", f"{p}.ffn", role)
    node(f"{p}.ffn.experts", "experts", f"Routed experts ×{n_exp}", f"{p}.ffn", role)
    g.add_edge(hc_ffn, ffn, kind="residual")
    return ffn


def _attn_label(role: LayerRole) -> str:
    if role.ratio == 0:
        return "Attention (window only)"
    if role.attn_kind in ("CSA", "HCA"):
        return f"Attention ({role.attn_kind} ÷{role.ratio})"
    return f"Attention (ratio {role.ratio})"


def _add_drafter(g, node, args: ModelArgs) -> None:
    n = args.n_layers
    first, last = "mtp.0", f"mtp.{args.n_draft_stages - 1}"
    g.add_edge("embed", f"{first}.hc_attn", kind="flow")  # draft ids are embedded with the shared table
    for s in range(1, args.n_draft_stages):
        _link(g, f"mtp.{s - 1}.ffn", f"mtp.{s}.hc_attn")
    if not args.has_dspark:
        for s in range(args.n_draft_stages):
            g.add_edge(f"layers.{n - 1}.ffn", f"mtp.{s}", kind="tap")
        return
    proj = node(f"{first}.main_proj", "main_proj", f"main_proj ({len(args.dspark_target_layer_ids)} taps → dim)",
                first, args.roles[n])
    node(f"{first}.main_norm", "main_norm", "main_norm", first, args.roles[n])
    _link(g, proj, f"{first}.main_norm")
    for t in args.dspark_target_layer_ids:
        g.add_edge(f"layers.{t}", proj, kind="tap")
    for s in range(args.n_draft_stages):
        g.add_edge(f"{first}.main_norm", f"mtp.{s}.attn", kind="shares")  # every stage's window KV from main_x
    role = args.roles[-1]
    norm = _link(g, f"{last}.ffn", node(f"{last}.norm", "draft_norm", "Draft norm", last, role))
    g.add_edge(norm, "head", kind="flow")  # base logits use the backbone's LM head
    markov = node(f"{last}.markov_head", "markov_head", f"Markov head (rank {args.dspark_markov_rank})", last, role)
    _link(g, "head", markov)
    _link(g, markov, node(f"{last}.confidence_head", "confidence_head", "Confidence head", last, role))


def _add_sharing(g, roles: tuple[LayerRole, ...]) -> None:
    """Edges from the layer that publishes compressed KV / index lists to the layers that read them."""
    for r in roles:
        if r.kv_mode == "reuse" and r.kv_source is not None:
            g.add_edge(f"layers.{r.kv_source}.attn.compressor", f"layers.{r.layer}.attn", kind="shares", what="kv")
        if r.indexer == "reuse" and r.index_source is not None:
            g.add_edge(f"layers.{r.index_source}.attn.indexer", f"layers.{r.layer}.attn", kind="shares", what="index")
        if r.indexer == "reindex" and r.index_key_source is not None:
            g.add_edge(f"layers.{r.index_key_source}.attn.indexer", f"layers.{r.layer}.attn.indexer",
                       kind="shares", what="index keys")


def owner_of(g: nx.DiGraph, tensor_name: str) -> str | None:
    """The deepest node whose id prefixes a checkpoint tensor name ('layers.3.hc_attn_fn' → 'layers.3.hc_attn')."""
    name = tensor_name
    while name:
        if name in g:
            return name
        cut = max(name.rfind("."), name.rfind("_"))
        if cut <= 0:
            return None
        name = name[:cut]
    return None


def attach_inventory(g: nx.DiGraph, inventory) -> list[str]:
    """Give each node its tensors (name, shape, dtype) and totals, own and with submodules.

    `inventory` is engine.accounting.accounting.tensor_inventory(args). Returns tensor names no node owns."""
    for _, data in g.nodes(data=True):
        data["tensors"], data["own_params"], data["own_bytes"] = [], 0, 0
    orphans = []
    for t in inventory:
        owner = owner_of(g, t.name)
        if owner is None:
            orphans.append(t.name)
            continue
        data = g.nodes[owner]
        data["tensors"].append(t)
        data["own_params"] += t.params
        data["own_bytes"] += t.nbytes
    for nid in reversed(list(nx.topological_sort(_containment(g)))):
        data = g.nodes[nid]
        kids = [c for c in g.successors(nid) if g.edges[nid, c]["kind"] == "part"]
        data["params"] = data["own_params"] + sum(g.nodes[c]["params"] for c in kids)
        data["bytes"] = data["own_bytes"] + sum(g.nodes[c]["bytes"] for c in kids)
    return orphans


def _containment(g: nx.DiGraph) -> nx.DiGraph:
    tree = nx.DiGraph()
    tree.add_nodes_from(g)
    tree.add_edges_from((a, b) for a, b, k in g.edges(data="kind") if k == "part")
    return tree
