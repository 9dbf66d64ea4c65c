"""Each view's numbers are the checkpoint's learned parameters, put through the model's own maps."""
from __future__ import annotations

import torch

from engine.model.mhc import sinkhorn
from engine.quant.formats import dequantize_engram_rows
from engine.spec.roles import family_roles
from engine.weights.reader import WeightReader
from engine.weights.views import ENGRAM_BLOCK_ROWS, ENGRAM_SAMPLE_BLOCKS, run_view, view_for


def values(result, stat, tensor=None):
    return [r["value"] for r in result.rows if r["stat"] == stat and (tensor is None or r["tensor"] == tensor)]


def test_router_rows_are_the_learned_bias_per_expert_per_layer(official):
    r = WeightReader(official)
    result = run_view(r, "router")
    a = r.args
    assert len(result.rows) == (a.n_layers * a.n_routed_experts + a.n_draft_stages * a.draft_n_routed_experts)
    assert values(result, "bias", "layers.3.ffn.gate.bias") == r.tensor("layers.3.ffn.gate.bias").tolist()
    assert not values(result, "bias_vl")   # a text-only config has no image-token bias


def test_mhc_comb_is_sinkhorn_of_the_base_and_doubly_stochastic(official):
    r = WeightReader(official)
    result = run_view(r, "mhc")
    hc = r.args.hc_mult
    comb = torch.tensor(values(result, "comb", "layers.4.hc_ffn_base")).view(hc, hc)   # float32, as the model
    base = r.tensor("layers.4.hc_ffn_base")
    assert torch.allclose(comb, sinkhorn(base[2 * hc:].view(hc, hc), r.args.hc_sinkhorn_iters, r.args.hc_eps))
    assert torch.allclose(comb.sum(0), torch.ones(hc), atol=1e-4) and torch.allclose(comb.sum(1), torch.ones(hc),
                                                                                      atol=1e-4)
    assert values(result, "scale", "layers.4.hc_ffn_scale") == r.tensor("layers.4.hc_ffn_scale").tolist()


def test_hash_routing_counts_the_token_ids_of_each_expert(official_v4):
    r = WeightReader(official_v4)
    result = run_view(r, "hash_routing")
    a = r.args
    assert a.n_hash_layers == 2 and not result.absent and not result.problems
    for layer in range(a.n_hash_layers):
        name = f"layers.{layer}.ffn.gate.tid2eid"
        counts = values(result, "tokens", name)
        assert counts == torch.bincount(r.tensor(name).reshape(-1), minlength=a.n_routed_experts).tolist()
        assert sum(counts) == a.vocab_size * a.n_activated_experts
    router = run_view(r, "router")   # the hash-routed layers have no learned bias
    assert {row["layer"] for row in router.rows}.isdisjoint(range(a.n_hash_layers)) and not router.absent
    assert values(run_view(r, "mhc"), "pre", "hc_head_base")   # V4's learned final collapse


def test_engram_statistics_come_from_the_sampled_rows_only(official):
    r = WeightReader(official)
    result = run_view(r, "engram")
    a = r.args
    table = f"layers.{a.engram_layer_ids[0]}.engram.embed.weight"
    per_column = ENGRAM_SAMPLE_BLOCKS * ENGRAM_BLOCK_ROWS
    assert set(values(result, "rows_sampled", table)) == {per_column}
    n_columns = len(a.engram_layout.table_sizes()[0])
    row_bytes = r.nbytes(table) // r.shape(table)[0] + r.nbytes(table.replace("weight", "scale")) // r.shape(table)[0]
    table_reads = len(a.engram_layer_ids) * n_columns * per_column * row_bytes
    gates = sum(r.nbytes(f"layers.{i}.engram.{w}") for i in a.engram_layer_ids for w in ("q_weight", "k_weight"))
    assert result.bytes_read == table_reads + gates
    assert table_reads < r.nbytes(table) / 2
    first = dequantize_engram_rows(WeightReader(official).rows(table, 0, ENGRAM_BLOCK_ROWS),
                                   WeightReader(official).rows(table.replace("weight", "scale"), 0, ENGRAM_BLOCK_ROWS))
    assert first.norm(dim=1).min() > 0 and values(result, "zero_rows", table)[0] >= 0


def test_dspark_product_singular_values_are_those_of_w1_w2t(official):
    r = WeightReader(official)
    result = run_view(r, "dspark")
    a = r.args
    last = f"mtp.{a.n_draft_stages - 1}.markov_head"
    w1, w2 = (r.weight(f"{last}.{w}.weight").double() for w in family_roles(a).markov_names)
    # σ(W1·W2ᵀ)² are the eigenvalues of (W1ᵀW1)(W2ᵀW2) [rank, rank] (the [vocab, vocab] SVD takes a minute)
    want = torch.linalg.eigvals((w1.T @ w1) @ (w2.T @ w2)).real.sort(descending=True).values.sqrt()
    got = torch.tensor(values(result, "product_singular_value"), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-6)
    conf = r.weight(f"mtp.{a.n_draft_stages - 1}.confidence_head.proj.weight").reshape(-1)
    assert values(result, "norm")[:2] == [float(conf[: a.dim].double().norm()), float(conf[a.dim:].double().norm())]
    main = r.weight("mtp.0.main_proj.weight").double().view(a.dim, len(a.dspark_target_layer_ids), a.dim)
    assert torch.allclose(torch.tensor(values(result, "norm", "mtp.0.main_proj.weight"), dtype=torch.float64),
                          main.norm(dim=(0, 2)))


def test_weight_rows_dequantize_only_the_blocks_they_need(official):
    r = WeightReader(official)
    name = "layers.2.attn.wq_b.weight"   # FP8 with [b0, b1] block scales
    whole = r.weight(name)
    before = r.bytes_read
    part = r.weight_rows(name, 5, 9)
    b0 = r.args.weight_block_size[0]
    assert part.equal(whole[5:9])
    assert r.bytes_read - before == b0 * r.shape(name)[1] + r.nbytes(name.replace("weight", "scale")) // \
        r.shape(name.replace("weight", "scale"))[0]


def test_sinks_and_norms_are_per_layer_per_head(official):
    r = WeightReader(official)
    sinks = run_view(r, "attention_sink")
    assert values(sinks, "sink", "layers.2.attn.attn_sink") == r.tensor("layers.2.attn.attn_sink").tolist()
    norms = run_view(r, "norms")
    gain = r.tensor("layers.2.attn_norm.weight").float()
    assert values(norms, "mean", "layers.2.attn_norm.weight") == [float(gain.mean())]
    assert {row["tensor"] for row in norms.rows} == {n for n in r.weight_map if n.endswith("norm.weight")}


def test_every_box_type_has_its_view():
    assert view_for("gate") == "router" and view_for("hash_gate") == "hash_routing"
    assert view_for("experts") == "experts" and view_for("mhc") == "mhc" and view_for("engram") == "engram"
    assert view_for("markov_head") == "dspark" and view_for("attention") == "attention_sink"
    assert view_for("embed") is None
