"""Few-row products whose rows do not depend on how many rows a call has, so that a DSpark verify block's rows round
as decode steps' do and greedy DSpark gives plain greedy decoding's tokens bit for bit.

torch's matmul adds in another order for one row (a matrix-vector product) than for six (a matrix product): the same
value up to the last bits. At the release's widths the reference's FP8 rounding of activations turns such a bit into
a whole FP8 step of some element, and the logits of a verify block's row then differ from the decode step's by a few
hundredths, enough to swap two near-tied tokens (`scripts/verify_rows.py`, docs/benchmarks.md). The quantized
linears already run few rows through the C++ kernel of engine.kernels.cpu_quant_linear, which gives each row the same
additions at any count; here the plain fp32 and bf16 weights (the head, the router, mHC's projections, the
compressors' and indexers' projections) take the same loop."""
from __future__ import annotations

import torch

from ..kernels import cpu_quant_linear
from .sync_free import sync_free_active

# Rows up to which the kernel runs: a decode step (1), a DSpark verify or draft block (block + 1 = 6), a batch of a
# few of them. Wider calls (prefills) keep torch's products, whose rows then round alike in both paths.
KERNEL_ROWS = 16


def few_rows(x: torch.Tensor) -> bool:
    """Whether x [..., K] is a few CPU rows (1..KERNEL_ROWS) outside autograd and compiled or graphed bodies."""
    return (x.device.type == "cpu" and not sync_free_active() and not (torch.is_grad_enabled() and x.requires_grad)
            and x.dtype in (torch.float32, torch.bfloat16) and 0 < x.numel() <= KERNEL_ROWS * x.size(-1))


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """x [..., K] @ weight [N, K]ᵀ → [..., N] in out_dtype (default x's), the products summed in fp32 (as the bf16
    paths of engine.speedups.cpu_bf16 sum them), each row the same additions at any row count; None where the call
    is not a few rows (few_rows), the weight is not a plain fp32 or bf16 CPU matrix without autograd, or the kernel
    did not build: the caller then takes its own product."""
    if not few_rows(x) or weight.device.type != "cpu" or weight.dim() != 2 or not weight.is_contiguous():
        return None
    if weight.dtype not in (torch.float32, torch.bfloat16) or (torch.is_grad_enabled() and weight.requires_grad):
        return None
    kernel = cpu_quant_linear.load()
    if kernel is None:
        return None
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))                         # [rows, K]
    if rows.dtype != torch.float32 or not rows.is_contiguous():   # (skipped where not needed: a decode step makes
        rows = rows.float().contiguous()                          # over a hundred of these calls)
    y = kernel.float_rows(rows, weight)                                              # [rows, N] fp32
    if (out_dtype or x.dtype) != torch.float32:
        y = y.to(out_dtype or x.dtype)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.size(0))


# torch's elementwise CPU loops run whole vectors of 2 × (up to 16) lanes, then a scalar loop over the rest, and the
# vector exp or log (Sleef) may round differently from the scalar one: a decode step's 4 Engram gates are all in the
# scalar tail where a verify block's first 16 are in vectors. A multiple of this many elements has no tail.
LANES = 64


def lanewise(op, x: torch.Tensor) -> torch.Tensor:
    """op(x) for an elementwise op, every element through torch's vector loop (x padded with zeros to a multiple of
    LANES elements, the padding dropped): each element then rounds alike whatever the tensor's size. Other calls
    than a few CPU rows (few_rows) are op(x) itself."""
    n = x.numel()
    if not few_rows(x) or n % LANES == 0:
        return op(x)
    padded = torch.zeros(n + (-n) % LANES, dtype=x.dtype)
    padded[:n] = x.reshape(-1)
    return op(padded)[:n].view(x.shape)
