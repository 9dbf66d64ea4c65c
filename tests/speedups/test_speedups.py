"""Speed transforms (engine.speedups) on the tiny V4.1 model: same results as the reference, which autograd and
sync_free() keep where they must."""
import numpy as np
import pytest
import torch

from engine.model import Transformer, init_weights
from engine.model.mhc import sinkhorn
from engine.model.moe import MoE
from engine.speedups import apply_speedups, prepare_for_inference, sync_free
from engine.speedups.fast_moe import FastMoE
from engine.speedups.sinkhorn import fast_sinkhorn, sinkhorn_numpy
from tests.model_helpers import RecordingTrace, random_tokens, synthetic_token_map, tiny_args

SMALL = dict(vocab_size=2048, dspark_noise_token_id=2047)


def reference_model(dtype=torch.float64, **changes) -> Transformer:
    a = tiny_args(**SMALL, **changes)
    m = Transformer(a, synthetic_token_map(a), dtype=dtype)
    init_weights(m, 0)
    return m.eval()


def test_speedups_swap_code_only_and_match_the_reference():
    ref, fast = reference_model(), reference_model()
    state = {k: v.clone() for k, v in fast.state_dict().items()}
    assert apply_speedups(fast) is fast and apply_speedups(fast) is fast                 # idempotent
    assert all(type(m) is FastMoE for m in fast.modules() if isinstance(m, MoE))
    assert not any(type(m) is FastMoE for m in ref.modules())
    after = fast.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(state[k], v) for k, v in after.items())
    toks = random_tokens(2, 12, seed=3, vocab=2048)
    out, traces = {}, {}
    with torch.no_grad():
        for name, m in (("ref", ref), ("fast", fast)):
            cache, traces[name] = m.new_cache(2, 32), RecordingTrace(attention=False)
            prefill = m(toks, cache, logits="all", trace=traces[name]).logits      # sorted experts (fast: dense)
            decode = m(toks[:, :1], cache, trace=traces[name]).logits              # gathered or dense
            out[name] = torch.cat([prefill[:, -1], decode])
    torch.testing.assert_close(out["fast"], out["ref"], atol=1e-10, rtol=1e-10)
    for a, b in zip(traces["fast"].moe, traces["ref"].moe, strict=True):
        assert torch.equal(a["ids"], b["ids"]), a["path"]
    for a, b in zip(traces["fast"].mhc, traces["ref"].mhc, strict=True):
        torch.testing.assert_close(a["comb"], b["comb"], atol=1e-12, rtol=0)


def test_a_model_made_under_inference_mode_runs_the_speed_paths_and_sees_its_weights_change():
    """Tensors made inside torch.inference_mode keep no version counter, which the speed paths' derived weights
    read to notice a weight changed in place: prepare_for_inference re-makes them as ordinary tensors."""
    toks = random_tokens(1, 6, seed=5, vocab=2048)
    normal = prepare_for_inference(reference_model(torch.float32))
    with torch.inference_mode():
        made = prepare_for_inference(reference_model(torch.float32))
        assert not any(t.is_inference() for t in [*made.parameters(), *made.buffers()])
        assert torch.equal(made(toks).logits, normal(toks).logits)
        other = Transformer(made.args, synthetic_token_map(made.args))
        init_weights(other, 1)
        made.load_state_dict(other.state_dict())          # in place, inside inference_mode: the derived copies follow
        changed = made(toks).logits
        assert torch.equal(changed, prepare_for_inference(other.eval())(toks).logits)
        assert not torch.equal(changed, normal(toks).logits)


def test_autograd_runs_the_reference_code_exactly():
    ref, fast = reference_model(torch.float32), apply_speedups(reference_model(torch.float32))
    toks = random_tokens(1, 6, seed=4, vocab=2048)
    lr, lf = ref(toks).logits, fast(toks).logits
    assert lf.requires_grad and torch.equal(lf, lr)


def test_sinkhorn_is_numpy_on_cpu_and_torch_under_sync_free_or_autograd():
    x = torch.randn(3, 5, 4, 4, dtype=torch.float32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fast_sinkhorn(x, 20, 1e-6), torch.from_numpy(sinkhorn_numpy(x.numpy(), 20, 1e-6)))
    with sync_free():
        assert torch.equal(fast_sinkhorn(x, 20, 1e-6), sinkhorn(x, 20, 1e-6))
    leaf = x.clone().requires_grad_(True)
    assert fast_sinkhorn(leaf, 20, 1e-6).requires_grad


def test_sync_free_experts_need_no_host_value():
    """On the meta device any host read fails: many tokens take the sorted path (it reads expert counts back),
    which sync_free() replaces with the gathered one."""
    a = tiny_args(**SMALL)
    m = prepare_for_inference(Transformer(a, np.zeros(a.vocab_size, dtype=np.int64), device="meta"))
    for moe in m.modules():
        if isinstance(moe, FastMoE):
            moe.dense_ok = False
    many = torch.zeros(2, 8, dtype=torch.long)                    # 16 tokens · k = 2 > 8 experts: sorted
    with torch.no_grad():
        with pytest.raises((RuntimeError, NotImplementedError), match="(?i)meta"):
            m(many, m.new_cache(2, 16))
        with sync_free():
            assert m(many, m.new_cache(2, 16)).logits.is_meta
