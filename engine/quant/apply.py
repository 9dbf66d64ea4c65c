"""quantize_model: a built Transformer turned, in place, into the official checkpoint's storage (spec §2.2–2.4).

What it makes, name by name from engine.accounting.inventory.tensor_inventory(args) (the config must store dtype
"fp8"; expert_dtype "fp4" gives MXFP4 routed experts):
* every `X.weight` stored F8_E4M3 → FP8Linear: `X.weight` float8_e4m3fn + `X.scale` E8M0, input FP8-quantized;
* every `X.weight` stored I8 → FP4Linear: packed MXFP4 + E8M0, input FP8-quantized; every MoE → QuantMoE;
* `layers.L.engram.embed` → HostEngramTable: FP8 rows + scales on the host behind RowSources;
* `attn.wo_a` stays a plain Linear in the compute dtype: the reference dequantizes it at load (spec §2.4).
  Its weight is rounded through FP8 here (from values); a loader dequantizes the stored pair into it;
* everything else (embedding, head, norms, gate, fp32 mHC / sinks / biases) is left as built; the model
  already runs the head, the Markov and confidence heads and the ratio-2 compressor in fp32 (spec §2.4).

So `model.state_dict()` has exactly the inventory's names, shapes and dtypes (vision aside) except for the
DEQUANTIZED_AT_LOAD weights (compute dtype, same shape, no `.scale` entry) and the host tables, which list
meta stand-ins of the official shape and dtype and take `module.attach(weight=RowSource, scale=RowSource)`
(modules with `host_resident = True`). engine.checkpoint.official_load fills a model so prepared by name.

from_values=True quantizes the weights the model holds with engine.quant.formats (a model built and
initialised, or loaded unquantized); from_values=False (or a meta model) allocates the official storage
empty, for a loader. Building on the meta device and calling `model.to_empty(device=...)` afterwards avoids
ever allocating the unquantized weights (recompute non-persistent buffers such as rotary `freqs` then).
"""
from __future__ import annotations

import torch
from torch import nn

from ..accounting.inventory import tensor_inventory
from ..model.moe import MoE
from ..spec.errors import InputError
from .formats import (
    dequantize_engram_rows,
    dequantize_fp4,
    dequantize_fp8,
    quantize_engram_rows,
    quantize_fp4,
    quantize_fp8,
)
from .host_engram import HostEngramTable
from .modules import FP4Linear, FP8Linear, QuantizedLinear, QuantMoE

QUANTIZED_STORAGE = ("F8_E4M3", "I8")
DEQUANTIZED_AT_LOAD = (".attn.wo_a",)   # spec §2.4: convert.py dequantizes it to BF16
HOST_TABLES = ".engram.embed"


def quantized_modules(args) -> list[tuple[str, str]]:
    """(module path, storage dtype) of every module whose weight the official checkpoint quantizes."""
    return [(s.name.removesuffix(".weight"), s.dtype) for s in tensor_inventory(args)
            if s.dtype in QUANTIZED_STORAGE and s.name.endswith(".weight")]


def quantize_model(model: nn.Module, *, from_values: bool = True) -> nn.Module:
    """Turn `model` (a Transformer whose config stores FP8/FP4) into official storage in place; see the module
    docstring. Idempotent; returns `model`."""
    args = model.args
    if args.dtype != "fp8":
        raise InputError(f"config '{args.name or args.model_type}' stores its weights as {args.dtype!r}; "
                         "quantize_model needs a config with dtype 'fp8' (and expert_dtype 'fp4' for MXFP4 experts)")
    block = tuple(args.weight_block_size)
    with torch.no_grad():
        for path, storage in quantized_modules(args):
            module = model.get_submodule(path)
            if isinstance(module, (QuantizedLinear, HostEngramTable)):
                continue
            if path.endswith(HOST_TABLES):
                model.get_submodule(path.rpartition(".")[0]).embed = HostEngramTable.from_embedding(module, from_values)
            elif path.endswith(DEQUANTIZED_AT_LOAD):
                if from_values and not module.weight.is_meta:
                    module.weight.copy_(round_trip(module.weight, storage, block))
            else:
                (FP4Linear if storage == "I8" else FP8Linear).adopt(module, block, from_values)
    for module in model.modules():
        if isinstance(module, MoE) and not isinstance(module, QuantMoE):
            QuantMoE.adopt(module)
    return model


def round_trip(w: torch.Tensor, storage: str, block: tuple[int, int], engram: bool = False) -> torch.Tensor:
    """A weight's value after storage in the official format and dequantization (float32, on the host)."""
    wf = w.detach().float().cpu()
    if engram:
        return dequantize_engram_rows(*quantize_engram_rows(wf))
    if storage == "I8":
        return dequantize_fp4(*quantize_fp4(wf))
    return dequantize_fp8(*quantize_fp8(wf, block), block)


def round_trip_weights(model: nn.Module) -> nn.Module:
    """The plain-model reference of a quantized model: every weight the official checkpoint quantizes is
    replaced in place by its dequantized FP8 / MXFP4 / Engram-row value, in the model's own classes. With
    activation quantization on (EngineOptions act_quant) it computes what quantize_model's model computes,
    up to accumulation order. Returns `model`."""
    block = tuple(model.args.weight_block_size)
    with torch.no_grad():
        for path, storage in quantized_modules(model.args):
            w = model.get_parameter(f"{path}.weight")
            w.copy_(round_trip(w, storage, block, engram=path.endswith(HOST_TABLES)))
    return model


def resident_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters and buffers (meta tensors hold none; host Engram rows are not
    parameters: they stay with their RowSources)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)
