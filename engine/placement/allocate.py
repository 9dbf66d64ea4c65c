"""Allocating a model built on the meta device where its placement says: nothing of a routed expert ever lands on the
device when the experts live on the host."""
from __future__ import annotations

import torch

from ..model import Transformer
from ..model.moe import MoE
from ..model.rope import Rotary
from ..spec.config import ModelArgs

HOST = torch.device("cpu")


def allocate(model: Transformer, device: str | torch.device) -> Transformer:
    """Give `model` (built on the meta device) its storage, uninitialised: every MoE's routed experts in host memory
    when model.options.experts is "host", everything else on `device`; then the rotary frequencies (non-persistent,
    the only buffers with values) recomputed. The values are a loader's or init_weights' to write. Returns `model`."""
    on_host = set()
    if model.options.experts == "host":
        on_host = {id(m) for moe in model.modules() if isinstance(moe, MoE) for m in moe.experts.modules()}
    for module in model.modules():
        module.to_empty(device=HOST if id(module) in on_host else device, recurse=False)
    for module in model.modules():
        if isinstance(module, Rotary):
            module.freqs = Rotary(*module.key, model.args, device=device).freqs
    return model


def build_model(args: ModelArgs, token_map=None, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", options=None) -> Transformer:
    """The Transformer of `args` for a loader or init_weights to fill: built on `device` directly, or, with the routed
    experts on the host (options.experts "host"), built on the meta device and allocated (allocate)."""
    if options is None or options.experts != "host":
        return Transformer(args, token_map, dtype=dtype, device=device, options=options)
    return allocate(Transformer(args, token_map, dtype=dtype, device="meta", options=options), device)

