"""The speed transforms as functions of a built model: the PyTorch speed paths, the Triton swap, both per options."""
from __future__ import annotations

import torch
from torch import nn

from ..kernels.runtime import require
from ..model.attention import Attention
from ..model.block import Block
from ..model.compressor import Compressor
from ..model.draft import DraftAttention, DraftStage, MarkovHead
from ..model.engram import Engram
from ..model.indexer import Indexer
from ..model.linear import Linear
from ..model.moe import Gate, MoE
from ..model.norm import RMSNorm
from ..model.transformer import Transformer
from ..quant.modules import FP4Linear, FP8Linear
from ..spec.errors import InputError
from .fast_attention import FastAttention
from .fast_block import FastBlock, FastDraftStage
from .fast_compressor import FastCompressor
from .fast_draft import FastDraftAttention, FastMarkovHead
from .fast_engram import FastEngram
from .fast_gate import FastGate
from .fast_head import FastTransformer
from .fast_indexer import FastIndexer
from .fast_linear import FastLinear
from .fast_moe import FastMoE
from .fast_norm import FastRMSNorm
from .fast_quant_linear import FastFP4Linear, FastFP8Linear
from .kernel_modules import KernelBlock, KernelDraftStage, KernelEngram, KernelGate, KernelMoE
from .kernel_quant import KernelFP4Linear, KernelFP8Linear
from .sinkhorn import fast_sinkhorn

BACKENDS = ("torch", "triton")
# reference class → its PyTorch speed path (same parameters; exact types only, so that a class another transform
# chose, e.g. engine.parallel's, is left alone)
FAST_CLASSES = {Transformer: FastTransformer, Block: FastBlock, DraftStage: FastDraftStage, RMSNorm: FastRMSNorm,
                Linear: FastLinear, Attention: FastAttention, DraftAttention: FastDraftAttention,
                MarkovHead: FastMarkovHead, Compressor: FastCompressor, Indexer: FastIndexer, Gate: FastGate,
                FP8Linear: FastFP8Linear, FP4Linear: FastFP4Linear, Engram: FastEngram}
# PyTorch class → kernel-backed class (the MoE is a FastMoE by then: the kernels fall back to its paths)
KERNEL_CLASSES = {Block: KernelBlock, FastBlock: KernelBlock, DraftStage: KernelDraftStage,
                  FastDraftStage: KernelDraftStage, Gate: KernelGate, FastGate: KernelGate, FastMoE: KernelMoE,
                  Engram: KernelEngram, FastEngram: KernelEngram, FP8Linear: KernelFP8Linear,
                  FP4Linear: KernelFP4Linear, FastFP8Linear: KernelFP8Linear, FastFP4Linear: KernelFP4Linear}
# kernel-backed class → what remove_kernels leaves: the reference, except that the MoE keeps its speed paths
# (apply_speedups brings the other PyTorch speed paths back)
UNKERNELED = {KernelBlock: Block, KernelDraftStage: DraftStage, KernelGate: Gate, KernelMoE: FastMoE,
              KernelEngram: Engram, KernelFP8Linear: FP8Linear, KernelFP4Linear: FP4Linear}
# where engine.graphs.compiled_body keeps a model's compiled bodies: traced with the module classes of then, they are
# dropped when a transform here changes a class (their guards do not check the model's modules)
COMPILED_BODIES = "_compiled_bodies"


def _recast(model: nn.Module, module: nn.Module, cls: type) -> None:
    """module becomes a `cls` in place (same parameters); `model`'s compiled bodies, if any, are dropped."""
    if type(module) is not cls:
        module.__class__ = cls
        model.__dict__.pop(COMPILED_BODIES, None)


def prepare_for_inference(model: nn.Module) -> nn.Module:
    """What every place that builds a model for use calls: the transforms model.options asks for (kernels
    "torch": the PyTorch speed paths; "triton": those and the Triton kernels). Returns `model`, changed in place."""
    apply_speedups(model)
    if model.options.kernels == "triton":
        apply_kernels(model, "triton")
    return model


def apply_speedups(model: nn.Module) -> nn.Module:
    """The PyTorch speed paths, in place: every reference MoE becomes a FastMoE (dense, gathered, by expert or
    sorted experts per call), blocks run their mHC seams fused (engine.speedups.fast_mhc), norms are one op (a few
    rows on the CPU: the C++ kernel of engine.kernels.cpu_norm), the head is read in fp32 without a per-step
    conversion, the drafter's attention and Markov head take the few-token forms of a decode step (FAST_CLASSES);
    every block's Sinkhorn runs in numpy on the CPU, or for a few tokens in the C++ kernel of
    engine.kernels.cpu_seam. Same parameters and state dict, same results up to float rounding,
    same trace calls; with autograd on, the reference code runs. Idempotent; returns `model`."""
    track_versions(model)
    for module in model.modules():
        if type(module) is MoE:
            FastMoE.adopt(module)
            model.__dict__.pop(COMPILED_BODIES, None)
        fast = FAST_CLASSES.get(type(module))
        if fast is not None:
            _recast(model, module, fast)
        if isinstance(module, Block):
            module.sinkhorn = fast_sinkhorn
    return model


def track_versions(model: nn.Module) -> None:
    """Re-make as ordinary tensors the parameters and buffers that were made under torch.inference_mode (a model
    built or loaded inside it): such inference tensors keep no version counter, and the speed paths' derived
    weights (engine.speedups.derived, the expert stacks) tell from it that a weight changed in place. One tensor
    at a time, tied ones kept tied; a model made outside inference_mode is left as it is."""
    remade: dict[int, torch.Tensor] = {}
    with torch.inference_mode(False):
        for module in model.modules():
            for store in (module._parameters, module._buffers):
                for name, t in store.items():
                    if t is None or not t.is_inference():
                        continue
                    if id(t) not in remade:
                        copy = t.clone()
                        remade[id(t)] = nn.Parameter(copy, t.requires_grad) if isinstance(t, nn.Parameter) else copy
                    store[name] = remade[id(t)]


def apply_kernels(model: nn.Module, backend: str | None = None) -> nn.Module:
    """Switch `model` in place to `backend` ("triton" or "torch"; default: model.options.kernels) and return it.
    The parameters, state dict and trace calls are unchanged; only the forward code of the modules differs.
    With autograd on, or for a float64 model, the kernel modules run the PyTorch code."""
    backend = backend or getattr(getattr(model, "options", None), "kernels", "torch")
    if backend not in BACKENDS:
        raise InputError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return remove_kernels(model)
    require(next(model.parameters()).device)
    if next(model.parameters()).dtype == torch.float64:
        raise InputError("Triton kernels compute in fp32: build the model in float32, bfloat16 or float16, "
                         "not float64")
    apply_speedups(model)
    for module in model.modules():
        kernel_cls = KERNEL_CLASSES.get(type(module))
        if kernel_cls is not None:
            _recast(model, module, kernel_cls)
    return model


def remove_kernels(model: nn.Module) -> nn.Module:
    """Undo apply_kernels: every kernel-backed module returns to its PyTorch class."""
    for module in model.modules():
        cls = UNKERNELED.get(type(module))
        if cls is not None:
            _recast(model, module, cls)
    return model


def active_backend(model: nn.Module) -> str:
    """'triton' if any module of `model` runs kernels, else 'torch'."""
    return "triton" if any(type(m) in UNKERNELED for m in model.modules()) else "torch"
