"""Shared fixtures for the engine/model tests: a tiny V4.1 model, a synthetic Engram token map, a recording trace."""
from __future__ import annotations

import numpy as np
import torch

from engine.model import EngineOptions, Transformer, init_weights
from engine.model.mhc import stochastic_error
from engine.spec.config import load_config
from engine.speedups import prepare_for_inference

TINY = "configs/tiny-v4.1.json"
# a vision tower (described, not run) for the tiny V4.1 config: only with it do its routers hold gate.bias_vl
VISION = dict(vision_n_layers=1, vision_dim=32, vision_n_heads=2, vision_inter_dim=64)
# One intra-op thread: on the shared 2-core machine two OpenMP threads contend with other processes and
# make each small op ~10x slower.
torch.set_num_threads(1)


def tiny_args(**changes):
    a = load_config(TINY)
    return a.replace(**changes) if changes else a


def synthetic_token_map(args, seed: int = 0) -> np.ndarray:
    """Any int64 array of vocab_size entries below the compressed vocabulary size will do for tests."""
    return np.random.default_rng(seed).integers(0, args.engram_compressed_vocab_size, args.vocab_size, dtype=np.int64)


def tiny_model(dtype=torch.float64, seed: int = 0, options: EngineOptions | None = None, **changes) -> Transformer:
    """The tiny V4.1 model, random-init, prepared for inference as the engine prepares the models it builds."""
    a = tiny_args(**changes)
    m = prepare_for_inference(Transformer(a, synthetic_token_map(a), dtype=dtype, options=options))
    init_weights(m, seed)
    return m.eval()


def random_tokens(n_rows: int, n: int, seed: int = 0, vocab: int = 129280) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_rows, n), generator=g)


class RecordingTrace:
    """Keeps every call the model makes, as the real Trace would receive them."""

    def __init__(self, attention: bool = True):
        self.attention = attention
        self.moe, self.mhc, self.engram, self.attn = [], [], [], []

    def record_moe(self, path, rows, positions, ids, weights, scores, vision):
        self.moe.append(dict(path=path, rows=rows, positions=positions, ids=ids, weights=weights, scores=scores,
                             vision=vision))

    def record_mhc(self, path, site, rows, positions, pre, post, comb, row_err=None, col_err=None):
        if row_err is None:  # the model leaves the residuals to the trace, which derives them from comb
            row_err, col_err = stochastic_error(comb)
        self.mhc.append(dict(path=path, site=site, rows=rows, positions=positions, pre=pre, post=post, comb=comb,
                             row_err=row_err, col_err=col_err))

    def record_mhc_mix(self, path, site, rows, positions, pre, mix):
        """The fused seam's form (mix = [combᵀ | post]), unpacked as the Trace unpacks it."""
        self.record_mhc(path, site, rows, positions, pre, mix[..., -1], mix[..., :-1].transpose(-1, -2))

    def record_engram(self, path, rows, positions, compressed_ids, row_ids, gates):
        self.engram.append(dict(path=path, rows=rows, positions=positions, compressed_ids=compressed_ids,
                                row_ids=row_ids, gates=gates))

    def wants_attention(self, path):
        return self.attention

    def record_attention(self, path, rows, positions, topk, window_mass, compressed_mass, sink_mass):
        self.attn.append(dict(path=path, rows=rows, positions=positions, topk=topk, window_mass=window_mass,
                              compressed_mass=compressed_mass, sink_mass=sink_mass))


def decode_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """The logits [T, V] of T tokens fed as a 5-token prefill, a 6-token block (a DSpark verify's width), then one
    token at a time: every forward width the engine's CPU kernels serve."""
    cache = model.new_cache(1, tokens.size(1) + 1)
    with torch.inference_mode():
        out = [model(tokens[:, :5], cache, logits="all").logits[0],
               model(tokens[:, 5:11], cache, logits="all").logits[0]]
        out += [model(tokens[:, i:i + 1], cache).logits for i in range(11, tokens.size(1))]
    return torch.cat(out)
