"""The kernels transform: swap a built model's Block, MoE and Engram modules for their Triton-backed variants."""
from __future__ import annotations

import torch
from torch import nn

BACKENDS = ("torch", "triton")


def _pairs():
    from ..model.block import Block
    from ..model.draft import DraftStage
    from ..model.engram import Engram
    from ..model.moe import MoE
    from .modules import KernelBlock, KernelDraftStage, KernelEngram, KernelMoE
    return {Block: KernelBlock, DraftStage: KernelDraftStage, MoE: KernelMoE, Engram: KernelEngram}


def apply_kernels(model: nn.Module, backend: str | None = None) -> nn.Module:
    """Switch `model` in place to `backend` ("triton" or "torch"; default: model.options.kernels) and return it.
    The parameters, state dict and trace calls are unchanged; only the forward code of the modules differs.
    With autograd on, or for a float64 model, the kernel modules run the PyTorch reference."""
    backend = backend or getattr(getattr(model, "options", None), "kernels", "torch")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return remove_kernels(model)
    from .runtime import require
    device = next(model.parameters()).device
    require(device)
    dtype = next(model.parameters()).dtype
    if dtype == torch.float64:
        raise ValueError("Triton kernels compute in fp32: build the model in float32, bfloat16 or float16, "
                         "not float64")
    for module in model.modules():
        kernel_cls = _pairs().get(type(module))
        if kernel_cls is not None:
            module.__class__ = kernel_cls
    return model


def remove_kernels(model: nn.Module) -> nn.Module:
    """Undo apply_kernels: every kernel-backed module returns to its reference class."""
    back = {k: r for r, k in _pairs().items()}  # importing the variants needs no triton
    for module in model.modules():
        ref_cls = back.get(type(module))
        if ref_cls is not None:
            module.__class__ = ref_cls
    return model


def active_backend(model: nn.Module) -> str:
    """'triton' if any module of `model` runs kernels, else 'torch'."""
    return "triton" if any(type(m).__module__ == f"{__package__}.modules" for m in model.modules()) else "torch"
