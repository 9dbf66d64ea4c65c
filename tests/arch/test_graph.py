"""The diagram graph: node ids are checkpoint paths, folding and roles, tensor ownership, layout, URL state."""
import pytest

from engine.accounting.inventory import inventory_tuple
from engine.spec.config import load_config
from engine.spec.presets import list_presets
from v41viz.arch.compare import field_diff, mechanisms, role_diff
from v41viz.arch.details import node_details, tensor_table
from v41viz.arch.folding import fold_layers
from v41viz.arch.graph import attach_inventory, build_graph, owner_of
from v41viz.arch.layout import build_layout
from v41viz.arch.module_docs import describe
from v41viz.arch.source import ENGINE_CODE, engine_source
from v41viz.ui.url_state import ViewState, from_query, sanitize, to_query, zoom_text

V41, V4, V4D = "deepseek-v4.1-flash", "deepseek-v4-flash", "deepseek-v4-flash-dspark"


def cfg(name):
    return load_config(list_presets()[name])


def test_v41_node_ids_are_checkpoint_paths_with_role_dependent_submodules():
    a = cfg(V41)
    g = build_graph(a)
    compressors = sorted(int(n.split(".")[1]) for n in g if n.endswith(".attn.compressor"))
    indexers = sorted(int(n.split(".")[1]) for n in g if n.startswith("layers.") and n.endswith(".attn.indexer"))
    assert compressors == [2, 8, 14, 20]
    assert indexers == [2, 8, 14, 20, 24, 28, 32, 36]
    assert sorted(n for n in g if n.endswith(".engram")) == ["layers.1.engram", "layers.14.engram"]
    assert {"embed", "norm", "head", "mtp.0.main_proj", "mtp.2.markov_head", "mtp.2.confidence_head"} <= set(g)
    assert "hc_head" not in g and not any(g.nodes[n]["type"] == "hash_gate" for n in g)
    assert sum(1 for n in g if g.nodes[n]["type"] == "block") == 40
    assert sum(1 for n in g if g.nodes[n]["type"] == "draft_block") == 3
    taps = sorted(u for u, v, k in g.edges(data="kind") if k == "tap")
    assert taps == ["layers.37", "layers.38", "layers.39"]
    # layer 25 reads layer 20's compressed KV and layer 24's index list
    assert g.edges["layers.20.attn.compressor", "layers.25.attn"]["what"] == "kv"
    assert g.edges["layers.24.attn.indexer", "layers.25.attn"]["what"] == "index"


def test_v4_has_hash_gates_hc_head_and_per_layer_compressors():
    a = cfg(V4)
    g = build_graph(a)
    assert "hc_head" in g
    assert [n for n in g if g.nodes[n]["type"] == "hash_gate"] == [f"layers.{i}.ffn.gate" for i in range(3)]
    assert sum(1 for n in g if n.endswith(".attn.compressor")) == 41      # every compressed layer owns one
    assert sum(1 for n in g if n.endswith(".attn.indexer")) == 21          # ratio-4 layers only
    assert "mtp.0" in g and "mtp.0.main_proj" not in g                    # plain MTP, no DSpark


def test_folding_v41_runs_and_v4_alternating_pairs():
    a = cfg(V41)
    groups = fold_layers(a.roles, a.n_layers)
    by_id = {g.id: g for g in groups}
    assert [g.id for g in groups if g.repeats > 1] == ["layers.3-7", "layers.9-13", "layers.15-19", "layers.21-23",
                                                       "layers.25-27", "layers.29-31", "layers.33-35", "layers.37-39"]
    assert by_id["layers.3-7"].repeats == 5 and by_id["layers.3-7"].variants == ("ratio-2 · KV←2 · idx←2",)
    assert "DSpark tap" in by_id["layers.37-39"].variants[0]
    assert by_id["layers.14"].variants == ("ratio-2 · KV source · Engram",)
    assert [g.id for g in groups if g.draft] == ["mtp.0", "mtp.1", "mtp.2"]
    # every backbone layer is in exactly one group, in order
    assert [l for g in groups if not g.draft for l in g.layers] == list(range(40))
    v4 = cfg(V4D)
    g4 = fold_layers(v4.roles, v4.n_layers)
    pair = next(g for g in g4 if g.period == 2)
    assert (pair.id, pair.repeats, pair.variants) == ("layers.3-38", 18, ("HCA · KV source", "CSA · KV source"))
    assert g4[0].id == "layers.0-1" and "hash-routed" in g4[0].variants[0]


@pytest.mark.parametrize("name", sorted(list_presets()))
def test_every_tensor_has_an_owner_and_sizes_add_up(name):
    a = cfg(name)
    g = build_graph(a)
    inv = inventory_tuple(a)
    assert attach_inventory(g, inv) == []
    roots = [n for n in g if g.nodes[n]["parent"] is None]
    assert sum(g.nodes[n]["params"] for n in roots) == sum(t.params for t in inv)
    assert sum(g.nodes[n]["bytes"] for n in roots) == sum(t.nbytes for t in inv)
    assert all(g.nodes[n]["params"] > 0 for n in g), [n for n in g if not g.nodes[n]["params"]]
    for n in g:  # every node has an explanation for its module type
        assert describe(g.nodes[n]["type"], a, g.nodes[n]["role"]).summary


def test_owner_and_expert_folding_in_the_tensor_table():
    a = cfg("tiny-v4.1")
    g = build_graph(a)
    attach_inventory(g, inventory_tuple(a))
    assert owner_of(g, "layers.3.hc_attn_fn") == "layers.3.hc_attn"
    assert owner_of(g, "layers.2.attn.compressor.wkv.weight") == "layers.2.attn.compressor"
    assert owner_of(g, "vision.blocks.0.attn.wqkv.weight") is None
    table = tensor_table(g, "layers.3.ffn.experts")
    w1 = table[table.tensor == "layers.3.ffn.experts.{i}.w1.weight"].iloc[0]
    assert w1["count"] == a.n_routed_experts
    d = node_details(a, g, fold_layers(a.roles, a.n_layers), "layers.3.ffn")
    assert d.params == sum(t.params for t in inventory_tuple(a) if t.name.startswith("layers.3.ffn."))


def test_every_tiny_v41_node_exists_in_the_engine_module_tree():
    import torch

    from engine.model.transformer import Transformer
    a = cfg("tiny-v4.1")
    g = build_graph(a)
    model = Transformer(a, device="meta", dtype=torch.float32)
    names = [k for k, _ in model.named_parameters()]
    owners = {owner_of(g, k) for k in names}
    assert None not in owners, [k for k in names if owner_of(g, k) is None][:5]
    structural = {"block", "draft_block", "moe", "attention"}   # own tensors through their submodules
    missing = [n for n in g if n not in owners and not (g.nodes[n]["type"] in structural
                                                        and any(o.startswith(n + ".") for o in owners))]
    assert missing == []
    modules = dict(model.named_modules())
    assert all(n in modules for n in g if g.nodes[n]["type"] in ("block", "attention", "moe", "compressor", "indexer",
                                                                   "engram", "markov_head", "confidence_head"))


def test_layout_expansion_and_focus():
    a = cfg(V41)
    g = build_graph(a)
    groups = fold_layers(a.roles, a.n_layers)
    folded = build_layout(a, g, groups, set(), focus_layer=14)
    stack = [k for k in folded.boxes if k.startswith("stack:")]
    assert "stack:layers.3-7" in stack and "stack:layers.5" not in stack
    assert folded.boxes["stack:layers.3-7"].badge == "×5"
    assert folded.focus_key == "stack:layers.14" and "detail:layers.14.engram" in folded.boxes
    assert folded.detail_title == "inside layers.14"
    opened = build_layout(a, g, groups, {"layers.3-7"}, focus_layer=5)
    assert [f"stack:layers.{i}" in opened.boxes for i in range(3, 8)] == [True] * 5
    assert opened.detail_title == "inside layers.5 (one of 5: layers 3–7)"
    assert len([k for k in opened.boxes if k.startswith("stack:")]) == len(stack) + 4
    # the layout references only real nodes, and no two boxes overlap in a column
    assert all(b.node in g for b in opened.boxes.values())
    ys = sorted(b.y for b in opened.boxes.values() if b.key.startswith("stack:"))
    assert min(b - a_ for a_, b in zip(ys, ys[1:])) > 0.74


def test_url_state_round_trip_and_sanitize():
    s = ViewState("tiny-v4.1", "layers.3.attn", ("layers.3-7", "layers.21-23"))
    assert from_query(to_query(s)) == ViewState("tiny-v4.1", "layers.3.attn", ("layers.21-23", "layers.3-7"))
    assert from_query({}) == ViewState()
    clean, problems = sanitize(ViewState("x", "layers.99.attn", ("layers.3-7", "bogus")), {"embed"}, {"layers.3-7"})
    assert clean == ViewState("x", "", ("layers.3-7",)) and len(problems) == 2 and "layers.99.attn" in problems[0]


def test_the_diagrams_zoom_in_the_url():
    z = ViewState("tiny-v4.1", "embed", zoom="150,800,1200")
    assert to_query(z)["zoom"] == "150,800,1200" and from_query(to_query(z)) == z
    assert zoom_text("149.6,800.4,-3") == "150,800,-3"     # whole numbers; a view may start above the drawing
    for bad in ("", "huge", "150,800", "150,800,1,2", "0,1,1", "nan,1,1", "inf,1,1", "150,1e9,1", "3000,1,1"):
        assert zoom_text(bad) is None, bad
    clean, problems = sanitize(ViewState("x", zoom="huge"), set(), set())
    assert clean.zoom == "" and "'huge' is not percent,x,y" in problems[0]


def test_compare_v4_vs_v41_names_the_differences():
    a, b = cfg(V4), cfg(V41)
    ma, mb = mechanisms(a), mechanisms(b)
    assert ma["Engram"] == "absent" and mb["Engram"] == "layers [1, 14]"
    assert ma["hash-routed layers"] == "3" and mb["hash-routed layers"] == "none"
    roles = role_diff(a, b)
    assert len(roles) == 44 and roles["differs"].iloc[2] and roles["B role"].iloc[43] == "—"
    fields = set(field_diff(a, b)["field"])
    assert {"dim", "n_layers", "compress_ratios", "engram_layer_ids"} <= fields and "hc_mult" not in fields


def test_engine_source_is_read_from_the_engine_or_reported_missing(monkeypatch):
    src = engine_source("attention")
    assert src.found and src.pieces[0].code.startswith("class Attention")
    assert src.pieces[0].path == "engine/model/attention.py"
    hashed = engine_source("hash_gate")      # V4 hash routing runs in the engine now
    assert hashed.found and hashed.pieces[0].code.startswith("class HashGate")
    monkeypatch.setitem(ENGINE_CODE, "not_there", ("engine.model.moe.NoSuchRouter",))
    missing = engine_source("not_there")
    assert not missing.found and "not implemented in the engine yet" in missing.message
