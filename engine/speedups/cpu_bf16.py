"""bf16 matrix products on the CPU in fp32, where torch's bf16 kernels are slower.

A small bf16 weight (at most RESIDENT_MAX_ELEMENTS) is multiplied through an fp32 copy made once and kept beside its
module (engine.speedups.derived, rebuilt when the weight changes), in every product on a CPU without bf16 matrix
instructions and in small products (one row, as in decode, or a few with a small weight) on a CPU with them: a bf16
kernel call has a fixed cost several times that of a small fp32 product, while larger products on a CPU with bf16
instructions run several times faster in bf16 (`scripts/bench_cpu_bf16.py` times the four ways on this machine). A
larger weight keeps the bf16 kernel, except that a product of several rows on a CPU without bf16 matrix instructions
widens both operands for that call. Either way the products are exact in fp32 (every bf16 value is) and summed in
fp32, as torch's bf16 kernels sum them, then rounded once to bf16: equal to the bf16 kernel up to summation order.
Code being compiled on a CPU with bf16 instructions reads only the copies that already exist (copy_made): one made
while tracing would be a conversion of the whole weight inside the compiled graph, on every call."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .casts import cast
from .derived import derived

WIDEN_FROM_ROWS = 2
# at most 4 MiB as fp32 per weight: beyond, a one-row product is bound by reading the weight, which bf16 halves
RESIDENT_MAX_ELEMENTS = 1 << 20
# a product up to this many multiply-adds reads the fp32 copy even where torch's bf16 kernels are fast: a one-row
# product with any resident weight, six rows (a DSpark verify) with a 192 × 192 one
COPY_MAX_MACS = 1 << 20


def _probe_bf16_matmul() -> bool:
    """torch's own probe of bf16 matrix instructions (assumed present where torch has none)."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    probes = [probe for probe in probes if probe is not None]
    return not probes or any(probe() for probe in probes)


# probed once, at import: code being compiled reads the constant, whereas dynamo cannot trace torch's probe (a
# graph break that splits a compiled decode body into pieces) and traces through functools.cache
NATIVE_BF16_MATMUL = _probe_bf16_matmul()


def native_bf16_matmul() -> bool:
    """Whether this CPU has bf16 matrix instructions."""
    return NATIVE_BF16_MATMUL


def resident(w: torch.Tensor) -> bool:
    """Whether products with weight w read an fp32 copy kept resident: a small bf16 weight on the CPU."""
    return w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.numel() <= RESIDENT_MAX_ELEMENTS


def copy_pays(rows: int, w: torch.Tensor) -> bool:
    """Whether a product of `rows` rows with a resident weight w (or a slice as large) reads the fp32 copy: on a
    CPU without bf16 matrix instructions always; on one with them while the product is small (at most
    COPY_MAX_MACS multiply-adds), below the fixed cost of a bf16 kernel call; a larger product keeps the bf16
    kernel, which can run several times faster than fp32 there (`scripts/bench_cpu_bf16.py`)."""
    return rows * w.numel() <= COPY_MAX_MACS or not native_bf16_matmul()


def through_fp32_copy(rows: int, w: torch.Tensor) -> bool:
    """Whether a product of `rows` rows with weight w reads w's resident fp32 copy (resident, copy_pays)."""
    return resident(w) and copy_pays(rows, w)


def fp32_copy(owner: torch.nn.Module, name: str, w: torch.Tensor, layout=lambda w: w) -> torch.Tensor:
    """layout(w) in fp32, kept in owner's derived weights under `name` and rebuilt when w changes."""
    return derived(owner).get(name, (w,), lambda: layout(w).float())


def copy_made(owner: torch.nn.Module, name: str) -> bool:
    """Whether owner's fp32 copy `name` may be read here: in eager code always (it is made on first use); in code
    being compiled on a CPU with bf16 matrix instructions only if it already exists, since a copy made while
    tracing becomes a conversion of the whole weight inside the compiled graph, run on every call (the graph then
    reads the weight in bf16 with torch's kernel). Without those instructions that kernel is the slower way, and the
    graph keeps the conversion, which is the product widened."""
    return not torch.compiler.is_compiling() or not native_bf16_matmul() or derived(owner).has(name)


def widens(x: torch.Tensor, w: torch.Tensor) -> bool:
    """x [..., K] @ w in fp32 for this call: both bf16 on a CPU without bf16 matrix instructions, x with at least 2
    rows."""
    return (x.dtype == w.dtype == torch.bfloat16 and x.device.type == "cpu"
            and x.numel() >= WIDEN_FROM_ROWS * x.size(-1) and not native_bf16_matmul())


def linear(x: torch.Tensor, w: torch.Tensor, owner: torch.nn.Module | None = None) -> torch.Tensor:
    """F.linear(x, w) (x [..., K], w [N, K]) in w's dtype, as Linear computes it (x cast to w's dtype first); in
    fp32 where that is faster: through owner's resident copy of w (resident), or widened for this call (widens)."""
    x = cast(x, w.dtype)
    if (owner is not None and through_fp32_copy(x.numel() // max(x.size(-1), 1), w)
            and copy_made(owner, "weight:fp32")):
        return F.linear(x.float(), fp32_copy(owner, "weight:fp32", w)).to(w.dtype)
    return F.linear(x.float(), w.float()).to(x.dtype) if widens(x, w) else F.linear(x, w)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N], widened to fp32 where that is faster (widens)."""
    return torch.mm(a.float(), b.float()).to(a.dtype) if widens(a, b) else torch.mm(a, b)
