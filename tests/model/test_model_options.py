"""EngineOptions and dtypes: bounded replay (spec §5, off by default), quant simulation, bf16 activations."""
import pytest
import torch

from engine.model import EngineOptions
from tests.model_helpers import random_tokens, tiny_model

SMALL = dict(vocab_size=2048, dspark_noise_token_id=2047)


def test_defaults_are_the_exact_reference():
    o = EngineOptions()
    assert o.bounded_replay is False and o.quant_sim is True and o.act_quant is None


def test_bounded_replay_keeps_encoder_state_and_approximates_the_rest():
    exact = tiny_model(**SMALL)
    replay = tiny_model(options=EngineOptions(bounded_replay=True), **SMALL)
    toks = random_tokens(1, 30, seed=4, vocab=2048)
    W = exact.args.window_size
    with torch.no_grad():
        ce, cr = exact.new_cache(1, 64), replay.new_cache(1, 64)
        le = exact(toks, ce, logits="all").logits
        lr, taps = replay(toks, cr, logits="all")
        assert lr.shape == (1, W, 2048) and taps.shape[1] == W     # only the replayed tail exists
        assert cr.pos.tolist() == [30]
        # every KV source sits at or before the replay boundary: their caches are the exact ones
        for src in ce.comp_kv:
            assert torch.equal(ce.comp_kv[src], cr.comp_kv[src]) and torch.equal(ce.index_k[src], cr.index_k[src])
        first_late = max(exact.args.kv_source_layers) + 1
        assert torch.equal(ce.window[first_late - 1], cr.window[first_late - 1])
        assert not torch.allclose(le[:, -1], lr[:, -1])                 # an approximation, not exact
        assert torch.isfinite(lr).all()
        nxt = random_tokens(1, 1, seed=5, vocab=2048)
        assert torch.isfinite(replay(nxt, cr).logits).all() and cr.pos.tolist() == [31]
        # prompts within one window are unaffected
        short = toks[:, :W]
        assert torch.equal(exact(short).logits, replay(short).logits)


def test_quant_simulation_quantizes_the_caches():
    on = tiny_model(**SMALL)
    off = tiny_model(options=EngineOptions(quant_sim=False), **SMALL)
    toks = random_tokens(1, 12, seed=6, vocab=2048)
    with torch.no_grad():
        c_on, c_off = on.new_cache(1, 32), off.new_cache(1, 32)
        on(toks, c_on), off(toks, c_off)
    ring_on, ring_off = c_on.window[0][0, :12], c_off.window[0][0, :12]
    assert not torch.equal(ring_on, ring_off)
    # FP8 block-32 values: at most 16 distinct magnitudes per binade; the unquantized ring has many more
    s = ring_on.abs().amax(-1, keepdim=True)
    mant = (ring_on / 2 ** torch.floor(torch.log2(ring_on.abs().clamp_min(1e-30)))).unique()
    assert mant.numel() <= 2 * 8 + 1
    assert (ring_on - ring_off).abs().max() <= s.max() / 8


def test_act_quant_follows_the_config_dtype():
    m = tiny_model(**SMALL)                       # tiny preset stores bf16 weights: no activation quant
    assert not any(getattr(mod, "act_quant", False) for mod in m.modules())
    fp8 = tiny_model(dtype=torch.float32, options=EngineOptions(act_quant=True), **SMALL)
    assert fp8.layers[0].attn.wq_a.act_quant and not fp8.layers[0].attn.wo_a.act_quant
    assert fp8.layers[0].ffn.experts[0].w1.act_quant and not fp8.head.act_quant
    toks = random_tokens(1, 8, seed=2, vocab=2048)
    with torch.no_grad():
        a, b = m(toks).logits, fp8(toks).logits
    assert not torch.equal(a, b) and torch.corrcoef(torch.stack([a[0], b[0]]))[0, 1] > 0.9


def test_bf16_activations_track_fp32():
    f32 = tiny_model(dtype=torch.float32, **SMALL)
    bf = tiny_model(dtype=torch.bfloat16, **SMALL)
    toks = random_tokens(2, 16, seed=8, vocab=2048)
    with torch.no_grad():
        a, b = f32(toks).logits, bf(toks).logits
    assert b.dtype == torch.float32 and torch.isfinite(b).all()
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.95


def test_rollback_margin_option_is_checked():
    with pytest.raises(ValueError, match="rollback_margin"):
        tiny_model(options=EngineOptions(rollback_margin=3), **SMALL)
    m = tiny_model(options=EngineOptions(rollback_margin=20), **SMALL)
    assert m.new_cache(1, 16).window_slots == m.args.window_size + 20


def test_query_blocking_does_not_change_results():
    a = tiny_model(**SMALL)
    b = tiny_model(options=EngineOptions(attn_query_block=3), **SMALL)
    toks = random_tokens(2, 29, seed=11, vocab=2048)
    with torch.no_grad():
        torch.testing.assert_close(a(toks, logits="all").logits, b(toks, logits="all").logits, atol=1e-10, rtol=1e-10)
