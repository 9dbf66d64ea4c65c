"""The Sinkhorn of engine.model.mhc with less per-op overhead: numpy for many matrices, Python floats for one."""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

from ..model.mhc import sinkhorn
from .sync_free import sync_free_active


def sinkhorn_numpy(logits: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """engine.model.mhc.sinkhorn's op order in numpy, in place, its row and column sums as products with a ones
    vector (a small matmul costs half a numpy reduction): on CPU numpy's per-op overhead is a fraction of
    torch's, and a 20-iteration Sinkhorn is ~120 tiny sequential ops. Sums in another order: rounding only."""
    e = logits.dtype.type(eps)
    n = logits.shape[-1]
    col, row = np.ones((n, 1), logits.dtype), np.ones((1, n), logits.dtype)
    c = np.exp(logits - logits.max(-1, keepdims=True))
    c /= c @ col
    c += e
    s = row @ c
    s += e
    c /= s
    for _ in range(iters - 1):
        r = c @ col                                                           # [..., n, 1] row sums
        r += e
        c /= r
        s = row @ c                                                           # [..., 1, n] column sums
        s += e
        c /= s
    return c


def fast_sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Drop-in for engine.model.mhc.sinkhorn: numpy for CPU tensors without autograd (outside sync_free()),
    the torch reference otherwise."""
    if logits.device.type == "cpu" and not logits.requires_grad and not sync_free_active():
        return torch.from_numpy(sinkhorn_numpy(logits.numpy(), iters, eps))
    return sinkhorn(logits, iters, eps)


@lru_cache(maxsize=8)
def scalar_sinkhorn(n: int) -> Callable[[list[float], int, float], list[float]]:
    """The reference's Sinkhorn of ONE n×n matrix as straight-line Python on floats: f(logits, iters, eps) with
    the n² logits row-major (C[a][b] at a·n + b) → the n² entries of the doubly stochastic matrix, same order.

    A decode step has one matrix per mHC seam and seams follow one another, so nothing batches them; a
    20-iteration Sinkhorn is ~120 sequential tiny ops, and at 2–5 µs per torch op (0.5–2 µs in numpy) their
    dispatch, not the arithmetic, is the cost. Unrolled over named locals, CPython does one iteration of a 4×4
    in ~2 µs. The sums and quotients are the reference's, in float64 (the reference's dtype for a float64 model;
    an fp32 model gets the result rounded once, instead of after every step)."""
    cells = [[f"c{a}_{b}" for b in range(n)] for a in range(n)]
    rows = [" + ".join(cells[a]) for a in range(n)]
    cols = [" + ".join(cells[a][b] for a in range(n)) for b in range(n)]
    every = ", ".join(c for row in cells for c in row)
    lines = [f"def sinkhorn_{n}x{n}(logits, iters, eps):", f"    ({every},) = logits"]
    for a in range(n):  # row softmax, + eps
        lines.append(f"    m = max({', '.join(cells[a])})")
        lines += [f"    {c} = exp({c} - m)" for c in cells[a]]
        lines.append(f"    s = {rows[a]}")
        lines += [f"    {c} = {c} / s + eps" for c in cells[a]]

    def normalise(indent: str) -> None:
        for b in range(n):
            lines.append(f"{indent}s = {cols[b]} + eps")
            lines.extend(f"{indent}{cells[a][b]} /= s" for a in range(n))

    normalise("    ")                                  # one column normalisation, then (iters − 1) × (rows, columns)
    lines.append("    for _ in range(iters - 1):")
    for a in range(n):
        lines.append(f"        s = {rows[a]} + eps")
        lines.extend(f"        {c} /= s" for c in cells[a])
    normalise("        ")
    lines.append(f"    return [{every}]")
    namespace = {"exp": math.exp}
    exec("\n".join(lines), namespace)  # noqa: S102 - source built above from integers only
    return namespace[f"sinkhorn_{n}x{n}"]
