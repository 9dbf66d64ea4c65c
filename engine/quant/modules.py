"""Linears and the MoE over weights kept in the official storage formats, dequantized per use (spec §2.4, §3.4)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.linear import Linear
from ..model.moe import MoE
from ..model.quant import fp8_qdq
from .formats import FP4_BLOCK, dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x [..., in] · Wᵀ, W = the FP8 weight [out, in] times its E8M0 [b0, b1]-block scales, dequantized for
    this call only. An e4m3 code times a power of two is exact in bf16 and fp32, so this equals a plain
    linear over the dequantized weight; the reference's FP8 GEMM (spec §3.4) sums fp32 per 32-wide K block
    instead, which differs from it by accumulation order only (≈ 1 bf16 ulp)."""
    return F.linear(x, dequantize_fp8(weight, scale, block).to(x.dtype))


def fp4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., in] · Wᵀ, W = the MXFP4 weight (int8 [out, in/2], two E2M1 codes a byte) times its per-32
    E8M0 scales, dequantized for this call only (exact in bf16 and fp32, as for fp8_linear)."""
    return F.linear(x, dequantize_fp4(packed, scale).to(x.dtype))


class QuantizedLinear(Linear):
    """A Linear whose `weight` holds the checkpoint's codes and `scale` their E8M0 scales, both frozen
    parameters named as in the checkpoint. Made from a built Linear by `adopt` (in place, like the speed
    transforms): a weight with values is quantized (from_values), otherwise the official storage is allocated
    empty on the weight's device (meta stays meta) for a loader to fill."""

    storage = torch.float8_e4m3fn

    @classmethod
    def adopt(cls, linear: Linear, block: tuple[int, int], from_values: bool = True) -> QuantizedLinear:
        w = linear.weight
        if w.is_meta or not from_values:
            q = torch.empty(cls.stored_shape(w.shape), dtype=cls.storage, device=w.device)
            s = torch.empty(cls.scale_shape(w.shape, block), dtype=torch.float8_e8m0fnu, device=w.device)
        else:
            q, s = cls.quantize(w.detach().float().cpu(), block)
            q, s = q.to(w.device), s.to(w.device)
        del linear.weight
        linear.__class__ = cls
        linear.block = block
        linear.weight = nn.Parameter(q, requires_grad=False)
        linear.scale = nn.Parameter(s, requires_grad=False)
        return linear

    def _apply(self, fn, recurse=True):
        """`.to(device)` moves the storage; a dtype change (`model.to(torch.float32)`, `.half()`) does not
        reach it: cast codes would lose their scales. The compute dtype is the input's."""
        def move_only(t: torch.Tensor) -> torch.Tensor:
            probe = fn(t.new_empty(0))
            return fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        return super()._apply(move_only, recurse)


class FP8Linear(QuantizedLinear):
    """A dense FP8 linear (spec §2.2): weight float8_e4m3fn [out, in], scale E8M0 [⌈out/32⌉, ⌈in/32⌉].
    Its input is FP8-quantized per block of 32 first (act_quant, spec §3.2), as the reference's GEMM does."""

    block: tuple[int, int]

    @staticmethod
    def stored_shape(shape) -> tuple[int, int]:
        return tuple(shape)

    @staticmethod
    def scale_shape(shape, block) -> tuple[int, int]:
        return -(-shape[0] // block[0]), -(-shape[1] // block[1])

    @staticmethod
    def quantize(w: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_fp8(w, block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_quant:
            x = fp8_qdq(x)
        return fp8_linear(x, self.weight, self.scale, self.block)

    def extra_repr(self) -> str:
        return f"{self.in_features} → {self.out_features}, fp8 weight, {list(self.block)} blocks"


class FP4Linear(QuantizedLinear):
    """A routed expert's MXFP4 linear (spec §2.2): weight int8 [out, in/2] (low nibble = element 2j), scale
    E8M0 [out, ⌈in/32⌉]. Its input is FP8-quantized first (spec §3.4: FP8 activations, FP4 weights)."""

    storage = torch.int8

    @staticmethod
    def stored_shape(shape) -> tuple[int, int]:
        return shape[0], shape[1] // 2

    @staticmethod
    def scale_shape(shape, block) -> tuple[int, int]:
        return shape[0], -(-shape[1] // FP4_BLOCK)

    @staticmethod
    def quantize(w: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_fp4(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_quant:
            x = fp8_qdq(x)
        return fp4_linear(x, self.weight, self.scale)

    def extra_repr(self) -> str:
        return f"{self.in_features} → {self.out_features}, fp4 weight (MXFP4)"


class QuantMoE(MoE):
    """The reference MoE over quantized experts: each chosen expert dequantizes its own weights when it runs
    (the reference's expert-sorted loop), so no [E, …] stack of all experts ever exists, dequantized or packed.

    Trade-off: a dequantize per chosen expert per call and the loop's host read of the per-expert counts, so
    there is no sync-free (CUDA-graph) path. engine.speedups' FastMoE and KernelMoE stack every expert's
    weights; they adopt only the exact classes MoE and FastMoE, never this one."""

    @classmethod
    def adopt(cls, moe: MoE) -> QuantMoE:
        for cache in ("stacks", "dense_ok", "fused_experts"):  # a FastMoE's weight stacks: dropped with the weights
            moe.__dict__.pop(cache, None)
        moe.__class__ = cls
        return moe
