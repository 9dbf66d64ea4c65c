"""HostExpertsMoE (one GPU + host RAM, as KTransformers runs DeepSeek): the routed experts stay in host memory and
run on the host's CPU for the tokens routed to them; the router, the shared expert and the rest of the step stay on
the device. A transform adopted in place after loading, like engine.parallel's ExpertParallelMoE."""
from __future__ import annotations

import torch
from torch import nn

from ..model.moe import MoE
from ..quant.modules import QuantMoE
from ..spec.errors import InputError
from ..speedups import prepare_for_inference
from ..speedups.apply import remove_kernels
from ..speedups.fast_moe import FastMoE
from ..speedups.kernel_modules import KernelMoE
from .allocate import HOST

ADOPTED = (MoE, FastMoE, KernelMoE, QuantMoE)    # one process's MoEs (not engine.parallel's expert-parallel one)
WEIGHT_CACHES = ("stacks", "dense_ok", "fused_experts")   # FastMoE's stacked copies of the experts: never made here


class HostExpertsMoE(MoE):
    """MoE.forward unchanged: the router and the shared expert run on the device. routed_experts copies the hidden
    states [N, dim] and the routing [N, k] to the host, runs the reference's expert-sorted loop there (each chosen
    expert once, on its own tokens; a packed MXFP4 expert dequantizes its weights for that call only, QuantMoE's CPU
    path) and copies the weighted sum [N, dim] back. No stack of all experts is made (FastMoE's would copy every
    expert), so the experts' storage is their parameters' alone, in host memory.

    Trade-off: two copies per MoE layer and the loop's read of the per-expert counts on the host, so a decode step
    cannot be captured as a CUDA graph or compiled (engine.graphs refuses such a model). `moved_rows` counts the
    hidden-state rows sent to the host (the transfer runs even when host and device are both the CPU)."""
    forward = MoE.forward   # not FastMoE's shortcut, which stacks the shared expert with the routed ones
    host: torch.device
    moved_rows: int

    @classmethod
    def adopt(cls, moe: MoE, host: torch.device | str = HOST, label: str = "") -> HostExpertsMoE:
        if type(moe) not in ADOPTED:
            raise InputError(f"{label or 'a MoE'}: the host-experts placement takes one process's MoE (MoE, FastMoE, "
                             f"KernelMoE, QuantMoE), not {type(moe).__name__}; --experts host runs without torchrun's "
                             "expert parallelism")
        for cache in WEIGHT_CACHES:
            moe.__dict__.pop(cache, None)
        remove_kernels(moe.experts)  # the Triton GEMMs run on the device; the host runs the PyTorch CPU path
        moe.experts.to(host)         # a no-op for a model the loaders allocated so (engine.placement.allocate)
        moe.host, moe.moved_rows = torch.device(host), 0
        moe.__class__ = cls
        return moe

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, dim] and weights, ids [N, k] on the device → Σ_j weights[:, j] · expert_{ids[:, j]}(x) [N, dim]
        (fp32) on the device, computed on the host."""
        device = x.device
        y = MoE.routed_experts(self, x.to(self.host), weights.to(self.host), ids.to(self.host))
        self.moved_rows += x.size(0)
        return y.to(device)

    def extra_repr(self) -> str:
        return f"{self.n_experts} routed experts in host memory, run on {self.host}"


def place_experts(model: nn.Module, host: torch.device | str = HOST) -> nn.Module:
    """Every MoE of `model` (the drafter's `mtp.*` ones too) becomes a HostExpertsMoE whose experts live on `host`;
    the rest stays where it is. Idempotent; returns `model`."""
    for path, module in model.named_modules():
        if isinstance(module, MoE) and not isinstance(module, HostExpertsMoE):
            HostExpertsMoE.adopt(module, host, path)
    return model


def prepare_model(model: nn.Module) -> nn.Module:
    """What the loaders and Engine.load call on a built model: the speed transforms (prepare_for_inference), then
    the placement model.options asks for ("host": place_experts). Returns `model`, changed in place."""
    prepare_for_inference(model)
    if model.options.experts == "host":
        place_experts(model)
    return model


def has_host_experts(model: nn.Module) -> bool:
    return any(isinstance(m, HostExpertsMoE) for m in model.modules())


def refuse_host_experts(model: nn.Module, what: str) -> None:
    """InputError when `model` runs its routed experts on the host and `what` (a CUDA graph, a compiled body) would
    have to hold the host round trip."""
    if has_host_experts(model):
        raise InputError(f"{what} with the routed experts on the host (--experts host): each MoE layer copies its "
                         "tokens to the host and reads its per-expert counts there, which a captured CUDA graph or a "
                         "compiled step cannot hold; leave out --cuda-graphs / --compile, or keep the experts on the "
                         "device (--experts device)")
