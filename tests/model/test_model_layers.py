"""Layer roles, MoE routing, Engram gating/hashing, mHC in the running model, trace neutrality."""
import numpy as np
import pytest
import torch

from engine.accounting.inventory import inventory_tuple
from engine.model import EngineOptions, Transformer
from engine.model.moe import MoE
from engine.spec.config import load_config
from engine.spec.errors import InputError
from engine.speedups.fast_moe import FastMoE
from tests.model_helpers import VISION, RecordingTrace, random_tokens, synthetic_token_map, tiny_args, tiny_model

SMALL = dict(vocab_size=2048, dspark_noise_token_id=2047)


@pytest.fixture(scope="module")
def model():
    return tiny_model(**SMALL, **VISION)   # with a vision tower: image tokens route with gate.bias_vl


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(1, 40, seed=3, vocab=2048)


def capture_attention_outputs(model, fn):
    outs = {}
    hooks = [layer.attn.register_forward_hook(lambda m, i, o, k=k: outs.__setitem__(k, o.clone()))
             for k, layer in enumerate(model.layers)]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return outs


def test_only_kv_sources_hold_compressed_caches(model):
    cache = model.new_cache(1, 32)
    a = model.args
    assert set(cache.comp_kv) == set(a.kv_source_layers) == set(cache.index_k)
    assert set(cache.pending) == {s for s in a.kv_source_layers if a.compress_ratios[s] > 1}
    assert set(cache.window) == set(range(a.n_layers))
    for layer in model.layers:
        role = layer.role
        assert hasattr(layer.attn, "compressor") == (role.kv_mode == "own")
        assert hasattr(layer.attn, "indexer") == (role.indexer in ("own", "reindex"))
        if hasattr(layer.attn, "indexer"):
            assert hasattr(layer.attn.indexer, "wk") == (role.indexer == "own")


def test_reuse_layer_reads_its_sources_kv_and_index_list(model, tokens):
    """Perturbing source 2's compressed rows changes layers 2..3 (reuse of 2) but not 0..1; a reuse
    layer's index list is the very tensor its index source published."""
    roles = model.args.roles
    reuse = next(r for r in roles if r.indexer == "reuse")
    with torch.no_grad():
        cache = model.new_cache(1, 64)
        model(tokens[:, :30], cache)
        base = capture_attention_outputs(model, lambda: model(tokens[:, 30:31], cache))
        cache.rollback(30)
        src = reuse.kv_source
        cache.comp_kv[src][0, :5] += 1.0
        trace = RecordingTrace()
        moved = capture_attention_outputs(model, lambda: model(tokens[:, 30:31], cache, trace=trace))
    for k, role in enumerate(roles[: model.args.n_layers]):
        if k < src:
            assert torch.equal(base[k], moved[k]), f"layer {k} must not read layer {src}'s compressed KV"
        elif role.kv_source == src:
            assert not torch.equal(base[k], moved[k]), f"layer {k} must read layer {src}'s compressed KV"
    topk = {rec["path"]: rec["topk"] for rec in trace.attn}
    assert topk[f"{reuse.path}.attn"] is topk[f"layers.{reuse.index_source}.attn"]


def test_reindex_layer_scores_own_queries_within_candidates(model, tokens):
    roles = model.args.roles
    reindex = next(r for r in roles if r.indexer == "reindex")
    cand = model.args.candidate_source_layer
    assert reindex.uses_candidates and reindex.index_key_source == cand
    trace = RecordingTrace()
    with torch.no_grad():
        model(tokens, trace=trace)
    topk = {rec["path"]: rec["topk"] for rec in trace.attn}
    own, src = topk[f"{reindex.path}.attn"], topk[f"layers.{cand}.attn"]
    assert own is not src and own.shape == src.shape
    # late queries see more compressed rows than index_topk: a real selection happens
    k = model.args.index_topk
    assert own.shape[-1] == k and (own[0, -1] >= 0).all()
    assert not torch.equal(own, src)


def test_router_bias_selects_but_does_not_weight(model):
    moe: MoE = model.layers[3].ffn
    x = torch.randn(5, model.args.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        w0, ids0, s0 = moe.gate(x)
        old = moe.gate.bias.clone()
        moe.gate.bias[7] = 100.0                          # force expert 7 into every token's choice
        w1, ids1, s1 = moe.gate(x)
        moe.gate.bias.copy_(old)
    assert not (ids0 == 7).any(-1).all()
    assert (ids1 == 7).any(-1).all() and not torch.equal(ids0, ids1)
    raw = torch.nn.functional.softplus(x @ moe.gate.weight.T).sqrt()
    torch.testing.assert_close(s1, raw.gather(-1, ids1))                  # scores are unbiased
    torch.testing.assert_close(w1, s1 / s1.sum(-1, keepdim=True) * model.args.route_scale)
    # vision tokens use bias_vl instead
    with torch.no_grad():
        moe.gate.bias_vl[3] = 100.0
        _, ids_v, _ = moe.gate(x, torch.tensor([True, False, True, False, False]))
        moe.gate.bias_vl[3] = 0.0
    assert (ids_v[[0, 2]] == 3).any(-1).all() and torch.equal(ids_v[[1, 3, 4]], ids0[[1, 3, 4]])


def test_moe_gathered_and_dense_paths_equal_sorted_prefill_path(model):
    moe: FastMoE = model.layers[5].ffn
    x = torch.randn(1, 3, model.args.dim, dtype=torch.float64)
    assert moe.dense_ok  # a tiny model's experts are small enough to run densely
    with torch.no_grad():
        w, ids, _ = moe.gate(x.view(-1, x.size(-1)))
        a = moe.gathered_experts(x.view(-1, x.size(-1)), w, ids)
        b = MoE.routed_experts(moe, x.view(-1, x.size(-1)), w, ids)          # the reference: sorted by expert
        c = moe.dense_experts(x.view(-1, x.size(-1)), w, ids)
        with_shared = moe.dense_experts(x.view(-1, x.size(-1)), w, ids, shared=True)
        shared = moe.shared_experts(x.view(-1, x.size(-1)))
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(c, b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(with_shared, b + shared, atol=1e-12, rtol=1e-12)
    with torch.no_grad():  # changing an expert's weight in place rebuilds the dense matrices
        moe.experts[int(ids[0, 0])].w2.weight.mul_(2)
        torch.testing.assert_close(moe.dense_experts(x.view(-1, x.size(-1)), w, ids),
                                   MoE.routed_experts(moe, x.view(-1, x.size(-1)), w, ids), atol=1e-12, rtol=1e-12)
        moe.experts[int(ids[0, 0])].w2.weight.div_(2)                       # exact: the module fixture is shared
    for t in range(3):   # the definition: Σ_j expert_j(x) · w_j (weight applied before w2)
        want = sum(moe.experts[int(ids[t, j])](x[:, t], w[t, j]) for j in range(ids.size(1)))
        torch.testing.assert_close(a[t], want[0], atol=1e-12, rtol=1e-12)


def test_engram_rows_match_hand_hash_and_gates_are_zero_on_dead(model, tokens):
    a = model.args
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[0, 5:7] = True                                   # an image span
    trace = RecordingTrace(attention=False)
    with torch.no_grad():
        model(tokens[:, :12], trace=trace, image_mask=mask)
    recs = {r["path"]: r for r in trace.engram}
    assert set(recs) == {f"layers.{i}.engram" for i in a.engram_layer_ids}
    tm = model.token_map.numpy()
    comp = [int(tm[t]) if not mask[0, i] else -1 for i, t in enumerate(tokens[0, :12].tolist())]
    pad = int(tm[a.engram_pad_id])
    mults, primes, offs = a.engram_layout.multipliers(), a.engram_layout.table_sizes(), a.engram_layout.offsets()
    for li, layer in enumerate(a.engram_layer_ids):
        rec = recs[f"layers.{layer}.engram"]
        assert rec["compressed_ids"][0].tolist() == comp
        gates = rec["gates"][0]
        assert (gates[5:7] == 0).all() and (gates[:5] > 0).all() and (gates[7:] > 0).all()
        for t in (0, 3, 8, 11):                           # 8: look-back 2 reaches the image span → pad
            toks, blocked = [], False
            for s in range(a.engram_max_ngram_size):
                blocked = blocked or t - s < 0 or comp[t - s] == -1
                toks.append(pad if blocked else comp[t - s])
            col = 0
            for n in range(2, a.engram_max_ngram_size + 1):
                h = 0
                for s in range(n):
                    h ^= toks[s] * mults[li][s]
                for _head in range(a.engram_n_heads):
                    assert int(rec["row_ids"][0, t, col]) == h % primes[li][col] + offs[li][col]
                    col += 1
        assert (rec["row_ids"] < a.engram_num_embeddings[li]).all()


def test_engram_hash_agrees_with_the_numpy_hasher(model, tokens):
    from engine.text import engram_hash as hasher_mod
    trace = RecordingTrace(attention=False)
    with torch.no_grad():
        model(tokens[:, :10], trace=trace)
    hasher = hasher_mod.NgramHasher(model.args, model.token_map.numpy())
    want = np.asarray(hasher(tokens[:, :10].numpy(), 0))
    for li, layer in enumerate(model.args.engram_layer_ids):
        got = next(r for r in trace.engram if r["path"] == f"layers.{layer}.engram")["row_ids"]
        assert np.array_equal(got.numpy(), want[:, :, li])


def test_mhc_matrices_doubly_stochastic_and_pre_is_handed_on(model, tokens):
    trace = RecordingTrace(attention=False)
    with torch.no_grad():
        model(tokens[:, :16], trace=trace)
    assert len(trace.mhc) == 2 * model.args.n_layers
    prod = None
    for rec in trace.mhc:
        assert rec["row_err"].max() < 1e-5 and rec["col_err"].max() < 1e-5
        prod = rec["comb"] if prod is None else prod @ rec["comb"]
    assert (prod.sum(-1) - 1).abs().max() < 1e-4 and (prod.sum(-2) - 1).abs().max() < 1e-4


def test_trace_does_not_change_logits(model, tokens):
    with torch.no_grad():
        plain = model(tokens[:, :20], logits="all").logits
        traced = model(tokens[:, :20], logits="all", trace=RecordingTrace()).logits
    assert torch.equal(plain, traced)


def test_moe_trace_records_chosen_experts(model, tokens):
    trace = RecordingTrace(attention=False)
    with torch.no_grad():
        model(tokens[:, :6], trace=trace)
    rec = next(r for r in trace.moe if r["path"] == "layers.0.ffn")
    k = model.args.n_activated_experts
    assert rec["ids"].shape == (1, 6, k) and rec["positions"].tolist() == [list(range(6))]
    torch.testing.assert_close(rec["weights"].sum(-1), torch.full((1, 6), model.args.route_scale, dtype=torch.float64))


def test_activations_stay_finite_and_order_one_with_random_init():
    m = tiny_model(dtype=torch.float32, seed=5)
    stds = []
    hooks = [layer.register_forward_hook(lambda mod, i, o: stds.append(o[0].float().std().item()))
             for layer in m.layers]
    with torch.no_grad():
        logits = m(random_tokens(2, 24, seed=9), logits="all").logits
    for h in hooks:
        h.remove()
    assert len(stds) == m.args.n_layers
    assert all(0.2 < s < 20 for s in stds), stds
    assert torch.isfinite(logits).all() and 0.1 < logits.std() < 10


def test_v4_only_limits_and_bad_token_maps_are_refused():
    v4 = load_config("configs/tiny-v4.json").replace(vocab_size=2048, dspark_noise_token_id=2047)
    with pytest.raises(ValueError, match="bounded_replay needs shared KV sources"):
        Transformer(v4, options=EngineOptions(bounded_replay=True))
    with pytest.raises(ValueError, match="has no image tokens"):
        Transformer(v4)(torch.zeros(1, 3, dtype=torch.long), image_mask=torch.zeros(1, 3, dtype=torch.bool))
    a = load_config("configs/tiny-v4.1.json")
    with pytest.raises(ValueError, match="one per token id"):
        Transformer(a, np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="engram_compressed_vocab_size"):
        Transformer(a, np.full(a.vocab_size, a.engram_compressed_vocab_size, dtype=np.int64))
    m = Transformer(a.replace(**SMALL), dtype=torch.float32)
    with pytest.raises(ValueError, match="token_map"):
        m(torch.zeros(1, 3, dtype=torch.long))
    m.set_token_map(synthetic_token_map(a.replace(**SMALL)))
    with torch.no_grad():
        assert m(torch.zeros(1, 3, dtype=torch.long)).logits.shape == (1, 2048)


def test_attention_trace_masses_sum_to_one(model, tokens):
    trace = RecordingTrace()
    with torch.no_grad():
        model(tokens[:, :24], trace=trace)
    assert [r["path"] for r in trace.attn] == [f"layers.{i}.attn" for i in range(model.args.n_layers)]
    for rec in trace.attn:
        total = rec["window_mass"] + rec["compressed_mass"] + rec["sink_mass"]
        torch.testing.assert_close(total, torch.ones_like(total))
        ratio = model.args.compress_ratios[int(rec["path"].split(".")[1])]
        if ratio == 0:
            assert rec["topk"].shape[-1] == 0 and (rec["compressed_mass"] == 0).all()
        else:
            assert rec["topk"].shape[-1] == model.args.index_topk
            assert rec["compressed_mass"][0, -1] > 0
            # position 0 has passed no ratio-2 group, but its own ratio-1 row is visible
            want = [-1] * model.args.index_topk if ratio == 2 else [0] + [-1] * (model.args.index_topk - 1)
            assert rec["topk"][0, 0].tolist() == want


def test_taps_are_stream_means_entering_the_target_layers(model, tokens):
    seen = {}
    hooks = [model.layers[i].register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0].mean(2)))
             for i in model.args.dspark_target_layer_ids]
    with torch.no_grad():
        logits, taps = model(tokens[:, :9])
    for h in hooks:
        h.remove()
    d = model.args.dim
    assert taps.shape == (1, 9, len(model.args.dspark_target_layer_ids) * d)
    for k, i in enumerate(model.args.dspark_target_layer_ids):
        assert torch.equal(taps[..., k * d:(k + 1) * d], seen[i])


def test_a_text_only_v41_model_has_no_image_routing():
    """gate.bias_vl follows the config's vision tower (the reference's vision_enabled), in the model and the
    inventory alike, for every router (backbone and drafter)."""
    text, vision = tiny_args(), tiny_args(**VISION)
    for a, has in ((text, False), (vision, True)):
        state = Transformer(a, device="meta").state_dict()
        listed = {s.name for s in inventory_tuple(a)}
        routers = [f"{role.path}.ffn.gate.bias_vl" for role in a.roles]
        assert all((n in state) == has and (n in listed) == has for n in routers)
    with pytest.raises(InputError, match="no vision tower: vision_n_layers is 0"):
        Transformer(text)(torch.zeros(1, 3, dtype=torch.long), image_mask=torch.zeros(1, 3, dtype=torch.bool))
