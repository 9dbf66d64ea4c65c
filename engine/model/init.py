"""Seeded random initialisation for any V4-family config, scaled so activations stay O(1) through all layers."""
from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING

import torch

from ..spec.errors import InputError

if TYPE_CHECKING:  # transformer.py builds on this package's modules: named for annotations only
    from .transformer import Transformer

ONES = ("norm.weight", "q_weight", "k_weight")
ZEROS = ("attn_sink", "gate.bias", "gate.bias_vl")
# projections that write into the residual: shrunk by 1/sqrt(2·n_layers) so the sum over depth stays O(1)
RESIDUAL_OUT = ("attn.wo_b.weight", ".w2.weight")


def init_weights(model: Transformer, seed: int) -> None:
    """Fill every parameter from its own generator (seeded by `seed` and the tensor name), so the
    values do not depend on dtype, device or on which other tensors exist."""
    if model.device.type == "meta":
        return
    a = model.args
    depth = 1.0 / math.sqrt(2 * (a.n_layers + a.n_draft_stages))
    with torch.no_grad():
        for name, p in model.named_parameters():
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            p.copy_(_value(name, tuple(p.shape), a, depth, gen))
        for name, table in model.named_buffers():
            if name.endswith("tid2eid"):  # V4 hash routing: k distinct experts per token id
                gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
                n_experts = model.get_submodule(name.removesuffix(".gate.tid2eid")).n_experts
                table.copy_(torch.rand(table.size(0), n_experts, generator=gen).argsort(-1)[:, : table.size(1)])


def initial_value(name: str, shape: tuple, args, gen: torch.Generator) -> torch.Tensor:
    """The value init_weights gives the parameter `name` of `shape` from `gen`: what `engine quantize --synthetic`
    draws for a checkpoint tensor (a 2-D one a block of rows at a time: each row's scale depends on its width only)."""
    return _value(name, shape, args, 1.0 / math.sqrt(2 * (args.n_layers + args.n_draft_stages)), gen)


def _value(name: str, shape: tuple, a, depth: float, gen: torch.Generator) -> torch.Tensor:
    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std

    if name.endswith(ONES) or name.endswith("_scale") and ".hc_" in f".{name}":
        return torch.ones(shape)
    if name.endswith(ZEROS):
        return torch.zeros(shape)
    if "hc_" in name and name.endswith("_fn"):
        return normal(0.1 / math.sqrt(shape[1]))      # mixes ≈ N(0, 0.1²) after the RMS normalisation
    if name.endswith("hc_head_base"):                  # V4 final collapse: every stream weighted ~equally
        return torch.zeros(shape)
    if name.endswith(".ape"):                          # V4 compressor gate bias per window slot
        return normal(0.5)
    if "hc_" in name and name.endswith("_base"):
        hc = a.hc_mult
        base = torch.zeros(shape)
        base[2 * hc:] = torch.eye(hc).flatten() * 2.0  # comb starts near the identity: streams keep their own
        return base
    if name == "embed.weight" or name.endswith("engram.embed.weight"):
        return normal(1.0)
    if name.endswith(("markov_head.embed.weight", "markov_head.head.weight", "markov_head.markov_w1.weight",
                      "markov_head.markov_w2.weight")):
        return normal(0.02)
    if len(shape) == 2:                                # Linear [out, in]
        std = 1.0 / math.sqrt(shape[1])
        return normal(std * depth if name.endswith(RESIDUAL_OUT) else std)
    raise InputError(f"init_weights: no rule for parameter {name} of shape {shape}")
