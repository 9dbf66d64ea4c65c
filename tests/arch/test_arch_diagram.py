"""The readable diagram (issue 20, item 1): shapes on the arrows from the config, labels clear of every box, the
steps an opened attention / MoE box has (only those of the layer's role), their tensors and engine code, search,
the paint hook, and the export legend."""
from __future__ import annotations

import importlib
import inspect
import xml.etree.ElementTree as ET

import pytest

from engine.spec.config import load_config
from engine.spec.presets import list_presets
from v41viz.arch.diagram import diagram_html
from v41viz.arch.labels import box_rects, overlap, place_labels
from v41viz.arch.layout import build_layout
from v41viz.arch.model_view import build_view
from v41viz.arch.paint import paint_svg
from v41viz.arch.routes import edge_points
from v41viz.arch.search import build_index
from v41viz.arch.source import engine_code
from v41viz.arch.substeps import attention_steps, moe_steps

SVG = "{http://www.w3.org/2000/svg}"
BOTH = frozenset({"attn", "ffn"})
_VIEWS = {}


def view(name):
    if name not in _VIEWS:
        _VIEWS[name] = build_view(load_config(list_presets()[name]))
    return _VIEWS[name]


def layout(name, layer, opened=BOTH):
    v = view(name)
    return build_layout(v.args, v.graph, v.groups, set(), layer, v.size_text, opened)


def parse(html: str) -> ET.Element:
    return ET.fromstring(f"<root>{html}</root>")


def labels_by_edge(lay):
    """{(from node, to node): label text} of the labels the drawing places."""
    placed, dropped = place_labels(lay, [edge_points(lay, e) for e in lay.edges])
    out = {}
    for lab in placed:
        e = lay.edges[lab.edge]
        ends = (lay.boxes[e.a].node if e.a in lay.boxes else e.a, lay.boxes[e.b].node if e.b in lay.boxes else e.b)
        out[ends] = lab.text
    return out, dropped


@pytest.mark.parametrize("name, layer", [("default-small", 2), ("tiny-v4", 2), ("deepseek-v4.1-flash", 20)])
def test_the_arrows_carry_the_shapes_of_the_config(name, layer):
    a = view(name).args
    lay = layout(name, layer)
    shown, dropped = labels_by_edge(lay)
    assert dropped == [], [lay.edges[i] for i in dropped]
    p = f"layers.{layer}"
    streams, hidden = f"[B, S, {a.hc_mult}, {a.dim}]", f"[B, S, {a.dim}]"
    assert shown[("@in", "embed")] == "ids [B, S]" and shown[("head", "@out")] == f"logits [B, S, {a.vocab_size}]"
    assert shown[("embed", "layers.0")] == streams and shown[("norm", "head")] == hidden
    assert shown[(f"{p}.attn_norm", f"{p}.attn")] == hidden
    q, kv = f"[B, S, {a.n_heads}, {a.head_dim}]", f"[B, S, {a.head_dim}]"
    assert shown[(f"{p}.attn.q_lora", f"{p}.attn.rope")] == f"q {q}"
    assert shown[(f"{p}.attn.kv_proj", f"{p}.attn.rope")] == f"kv {kv}"
    assert shown[(f"{p}.attn.q_lora", f"{p}.attn.indexer")] == f"qr [B, S, {a.q_lora_rank}]"
    assert shown[(f"{p}.attn.indexer", f"{p}.attn.sparse_attn")] == f"ids [B, S, {a.index_topk}]"
    ratio = a.roles[layer].ratio
    rows = f"[B, {'T' if ratio == 1 else f'T/{ratio}'}, {a.head_dim}]"
    assert shown[(f"{p}.attn.compressor", f"{p}.attn.sparse_attn")] == f"rows {rows}"
    assert shown[(f"{p}.attn.sparse_attn", f"{p}.attn.wo")] == f"o {q}"
    assert shown[(f"{p}.attn.wo", f"{p}.hc_ffn")] == hidden
    k = a.n_activated_experts
    assert shown[(f"{p}.ffn.gate", f"{p}.ffn.experts")] == f"ids, weights [B·S, {k}]"
    # the drafter: the draft block's streams between the stages
    if a.has_dspark:
        assert shown[("mtp.0", "mtp.1")] == f"[B, γ, {a.hc_mult}, {a.dim}]"
    # and the drawing shows them
    texts = {t.text for t in parse(diagram_html(lay)).iter(f"{SVG}text") if "v41-shape" in (t.get("class") or "")}
    assert {f"q {q}", f"qr [B, S, {a.q_lora_rank}]", streams} <= texts


@pytest.mark.parametrize("name", sorted(list_presets()))
def test_labels_cover_no_box_and_no_other_label(name):
    v = view(name)
    for layer in sorted({0, v.default_focus(), v.args.n_layers - 1, v.args.n_layers, 3}):
        for opened in (frozenset(), BOTH):
            lay = layout(name, layer, opened)
            placed, dropped = place_labels(lay, [edge_points(lay, e) for e in lay.edges])
            boxes = box_rects(lay)
            assert not [lab.text for lab in placed if any(overlap(lab.rect, r) for r in boxes)], (layer, opened)
            pairs = [(p.text, q.text) for i, p in enumerate(placed) for q in placed[i + 1:] if overlap(p.rect, q.rect)]
            assert pairs == [], (layer, opened)
            inside = [lay.edges[i] for i in dropped if lay.edges[i].a.startswith(("step:", "open:", "detail:"))]
            assert inside == [], (layer, opened)    # every arrow of the opened layer keeps its shape


def step_names(a, layer, which="attn"):
    steps, _ = (attention_steps if which == "attn" else moe_steps)(a, a.roles[layer])
    return {s.name: s for s in steps}


def test_steps_follow_the_role_of_each_v41_layer():
    a = view("deepseek-v4.1-flash").args
    base = {"kv_proj", "q_lora", "rope", "sparse_attn", "wo"}
    assert set(step_names(a, 0)) == base                                     # window only: no compressed memory
    assert set(step_names(a, 2)) == base | {"compressor", "indexer"}         # KV source, own indexer
    reuse = step_names(a, 3)
    assert set(reuse) == base | {"compressed_kv", "index_reuse"}             # reads layer 2's rows and index list
    assert reuse["compressed_kv"].reads == "layers.2.attn.compressor" and "layer 2" in reuse["compressed_kv"].title
    assert reuse["index_reuse"].reads == "layers.2.attn.indexer"
    reindex = step_names(a, 24)
    assert set(reindex) == base | {"compressed_kv", "indexer"} and reindex["indexer"].title.endswith("(Reindex)")
    assert "YaRN" in step_names(a, 20)["rope"].title and "YaRN" not in step_names(a, 0)["rope"].title
    draft = step_names(a, a.n_layers)
    assert set(draft) == base and "ring" in draft["sparse_attn"].subtitle
    assert set(step_names(a, 5, "ffn")) == {"gate", "shared_experts", "experts", "combine"}
    assert step_names(a, 5, "ffn")["gate"].title == "Router"


def test_steps_follow_the_role_of_each_v4_layer():
    a = view("tiny-v4").args
    kinds = {r.layer: r.attn_kind for r in a.roles[: a.n_layers]}
    csa = next(layer for layer, k in kinds.items() if k == "CSA")
    hca = next(layer for layer, k in kinds.items() if k == "HCA")
    assert ({"compressor", "indexer"} <= set(step_names(a, csa))
            and "(overlap)" in step_names(a, csa)["compressor"].subtitle)
    assert "compressor" in step_names(a, hca) and "indexer" not in step_names(a, hca)
    assert "compressed rows" in step_names(a, hca)["sparse_attn"].subtitle    # no indexer: every visible row
    _, edges = attention_steps(a, a.roles[csa])
    assert ("compressor", "indexer") not in {(e.a, e.b) for e in edges}      # V4: the keys have their own compressor
    assert "head norm" in step_names(a, csa)["q_lora"].subtitle               # V4 normalises each query head
    hashed = next(r.layer for r in a.roles if r.hash_routed)
    assert step_names(a, hashed, "ffn")["gate"].title == "Hash router"


@pytest.mark.parametrize("name", ["tiny-v4.1", "tiny-v4", "default-small"])
def test_the_steps_partition_each_attention_modules_own_tensors(name):
    v = view(name)
    index = build_index(v.args, v.graph)
    for role in v.args.roles:
        p = f"{role.path}.attn"
        own = v.graph.nodes[p]["tensors"]
        steps = [s for s in index.steps.values() if s.parent == p and not s.module]
        owners = {t.name: [s.name for s in steps if any(t.name == f"{p}.{m}" or t.name.startswith(f"{p}.{m}.")
                                                        for m in s.owns)] for t in own}
        assert all(len(o) == 1 for o in owners.values()), owners
        modules = [s.id for s in index.steps.values() if s.parent == p and s.module]
        assert all(m in v.graph for m in modules)                           # module steps are graph nodes


def test_every_step_names_engine_code_that_exists():
    a = view("tiny-v4").args
    index = build_index(a, view("tiny-v4").graph)
    index41 = build_index(view("tiny-v4.1").args, view("tiny-v4.1").graph)
    code = {q for idx in (index, index41) for s in idx.steps.values() for q in s.code}
    src = engine_code(tuple(sorted(code)))
    assert src.message == "" and len(src.pieces) == len(code)
    for piece in src.pieces:   # the function, class or method read from the file is what Python finds
        module = piece.path.removesuffix(".py").replace("/", ".")
        obj = importlib.import_module(module)
        for part in piece.qualname.removeprefix(module + ".").split("."):
            obj = getattr(obj, part)
        lines, first = inspect.getsourcelines(obj)
        assert (first, "".join(lines)) == (piece.first_line, piece.code), piece.qualname


def test_search_finds_modules_by_path_and_name():
    v = view("deepseek-v4.1-flash")
    index = build_index(v.args, v.graph)
    hits = index.find("layers.3.attn")
    assert hits[0] == "layers.3.attn" and "layers.3.attn.q_lora" in hits and "layers.30.attn" not in hits
    assert index.find("LAYERS.12.ATTN")[0] == "layers.12.attn"
    assert index.find("indexer") == [f"layers.{i}.attn.indexer" for i in (2, 8, 14, 20, 24, 28, 32, 36)]
    assert index.find("engram") == ["layers.1.engram", "layers.14.engram"]
    assert index.find("rope 20") == ["layers.20.attn.rope"]
    assert len(index.find("q low-rank")) == v.args.n_layers + v.args.n_draft_stages
    assert index.find("   ") == [] and index.find("no such module") == []
    assert "mtp.2.markov_head" in index and "layers.25.attn.compressed_kv" in index
    assert "layers.25.attn.compressor" not in index                   # layer 25 reads layer 20's


def test_the_paint_hook_colours_the_named_boxes_and_adds_a_legend():
    lay = layout("tiny-v4.1", 2, frozenset({"attn"}))
    html = diagram_html(lay, "layers.2.attn", name="tiny-v4.1")
    fills = {"layers.2.attn.sparse_attn": ("#ff8800", "62%"), "layers.2.ffn": ("#3366ff", "0.73"),
             "layers.7.attn": ("#00aa00", "x")}   # only the focused layer (2) is drawn opened
    painted, missing = paint_svg(html, fills, [("#ff8800", "high"), ("#3366ff", "low")], "window mass")
    assert missing == ["layers.7.attn"]
    root = parse(painted)
    boxes = {g.get("data-node"): g for g in root.iter(f"{SVG}g")}
    assert len(list(root.iter(f"{SVG}g"))) == len(list(parse(html).iter(f"{SVG}g")))   # no box added or lost
    for node, (colour, value) in fills.items():
        if node in missing:
            continue
        g = boxes[node]
        card = next(r for r in g.iter(f"{SVG}rect") if r.get("class") == "v41-card")
        assert card.get("fill") == colour and "v41-painted" in g.get("class")
        assert value in [t.text for t in g.iter(f"{SVG}text")] and g.get("data-tip").endswith(f"window mass: {value}")
    unpainted = boxes["layers.2.attn.rope"]
    assert next(r for r in unpainted.iter(f"{SVG}rect") if r.get("class") == "v41-card").get("fill") != "#ff8800"
    assert ("window mass" in painted.split('<svg class="v41-diagram"', 1)[0]
            and painted.count('class="v41-xlegend"') == 2)


def test_the_svg_is_self_contained_with_a_hidden_export_legend():
    html = diagram_html(layout("deepseek-v4.1-flash", 20), "layers.20.attn.rope", name="deepseek-v4.1-flash")
    svg = parse(html).find(f"{SVG}svg")
    assert svg.get("font-family").endswith("sans-serif") and float(svg.get("data-legend-h")) > 0
    legend = svg.find(f"{SVG}svg")
    assert legend.get("class") == "v41-xlegend" and legend.get("display") == "none"
    assert "deepseek-v4.1-flash" in [t.text for t in legend.iter(f"{SVG}text")]
    boxes = [g for g in svg.iter(f"{SVG}g")]
    assert len({g.get("data-key") for g in boxes}) == len(boxes)            # one key per box; data-node is its id
    opened = [g for g in boxes if "v41-open" in g.get("class")]
    assert {g.get("data-node") for g in opened} == {"layers.20.attn", "layers.20.ffn"}
    toggles = [r.get("data-toggle") for r in svg.iter(f"{SVG}rect") if r.get("data-toggle")]
    assert sorted(toggles) == ["attn", "ffn"]
    closed = diagram_html(layout("deepseek-v4.1-flash", 20, frozenset()), "")
    assert sorted(g.get("data-opens") for g in parse(closed).iter(f"{SVG}g") if g.get("data-opens")) == ["attn", "ffn"]
    groups = {g.get("data-node"): g.get("data-covers") for g in parse(closed).iter(f"{SVG}g") if g.get("data-covers")}
    assert groups["layers.3"] == "layers.3 layers.4 layers.5 layers.6 layers.7"
