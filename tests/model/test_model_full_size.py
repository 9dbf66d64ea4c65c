"""Real dimensions: full-size V4.1 shapes through one layer of every role on the meta device, and the
tiny preset's state_dict against the official tensor inventory."""
import numpy as np
import torch

from engine.accounting.inventory import tensor_inventory
from engine.model import Transformer
from engine.spec.config import load_config
from engine.speedups import prepare_for_inference
from tests.model_helpers import TINY

TORCH_DTYPE = {"BF16": torch.bfloat16, "F32": torch.float32}


def one_layer_per_role():
    """V4.1-Flash widths, experts and tables, 8 layers that between them take every backbone role:
    window, window+Engram, ratio-2 KV source (+Engram, like layer 14), ratio-2 reuse, ratio-1 KV source
    and candidate source, ratio-1 reuse, Reindex within candidates, reuse of a Reindex; taps on 5..7."""
    a = load_config("configs/deepseek-v4.1-flash.json")
    return a.replace(n_layers=8, compress_ratios=(0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0), kv_source_layers=(2, 4),
                     index_source_layers=(2, 4, 6), candidate_source_layer=4, engram_layer_ids=(1, 2),
                     dspark_target_layer_ids=(5, 6, 7))


def test_full_size_shapes_run_through_every_role_on_meta():
    a = one_layer_per_role()
    assert len({r.summary for r in a.roles[: a.n_layers]}) == 8
    # prepared as for inference: the reference MoE sorts by expert counts read back to the host (no values on
    # meta); the gathered expert path the speed transform takes for a few tokens needs none
    m = prepare_for_inference(Transformer(a, np.zeros(a.vocab_size, dtype=np.int64), dtype=torch.bfloat16,
                                          device="meta"))
    assert m.layers[2].attn.wq_b.weight.shape == (64 * 512, 1280)
    assert m.layers[2].attn.wo_a.weight.shape == (8 * 1024, 4096)
    assert m.layers[1].engram.embed.weight.shape == (384006168, 256)
    assert m.layers[1].engram.wkv.weight.shape == (25600, 6144)
    assert len(m.layers[0].ffn.experts) == 384 and len(m.mtp[0].ffn.experts) == 128
    assert m.mtp[0].main_proj.weight.shape == (5120, 15360)
    cache = m.new_cache(2, 64)
    assert cache.window[0].shape == (2, 128 + cache.margin, 512) and cache.index_k[4].shape == (2, 65, 128)
    with torch.no_grad():
        logits, taps = m(torch.zeros(2, 3, dtype=torch.long), cache)
        step = m(torch.zeros(2, 1, dtype=torch.long), cache).logits
    assert logits.shape == (2, 129280) and logits.dtype == torch.float32 and logits.is_meta
    assert taps.shape == (2, 3, 3 * 5120)
    assert step.shape == (2, 129280) and cache.pos.tolist() == [4, 4]


def test_tiny_state_dict_equals_the_official_inventory_in_bf16():
    a = load_config(TINY)
    state = Transformer(a, dtype=torch.bfloat16, device="meta").state_dict()
    inv = {t.name: t for t in tensor_inventory(a)}
    assert sorted(state) == sorted(inv)
    for name, t in state.items():
        assert tuple(t.shape) == inv[name].shape, name
        assert t.dtype == TORCH_DTYPE[inv[name].dtype], f"{name}: {t.dtype} vs {inv[name].dtype}"


def test_rope_tables_are_not_persistent():
    m = Transformer(load_config(TINY), dtype=torch.bfloat16, device="meta")
    assert not any("freqs" in k or "mult" in k or "primes" in k for k in m.state_dict())
