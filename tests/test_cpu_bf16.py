"""engine.speedups.cpu_bf16: bf16 products of several rows widened to fp32 on a CPU without bf16 matrix instructions,
equal to torch's bf16 kernels up to summation order; one-row products, fp32 and CPUs with the instructions untouched."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.speedups import cpu_bf16


def operands(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 192, generator=g).bfloat16()
    w = torch.randn(768, 192, generator=g).bfloat16()
    return x, w


def test_which_products_widen(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    x, w = operands(4)
    assert cpu_bf16.widens(x, w)
    assert cpu_bf16.widens(x.view(2, 2, -1), w)                 # rows counted over every leading dim
    assert not cpu_bf16.widens(x[:1], w)                        # plain decode keeps the bf16 kernel
    assert not cpu_bf16.widens(x.float(), w.float())
    assert not cpu_bf16.widens(x, w.float())
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: True)
    assert not cpu_bf16.widens(x, w)


def test_widened_products_equal_the_bf16_kernels_up_to_summation_order(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    for rows in (2, 7, 32):
        x, w = operands(rows, seed=rows)
        exact = F.linear(x.double(), w.double())
        for got, kernel in ((cpu_bf16.linear(x, w), F.linear(x, w)), (cpu_bf16.mm(x, w.t()), torch.mm(x, w.t()))):
            assert got.dtype == torch.bfloat16 and got.shape == (rows, 768)
            # both round an fp32 sum of exact products once: at most one bf16 step apart, and as close to exact
            step = exact.abs().clamp_min(1e-3) * 2 ** -7
            assert bool(((got.double() - kernel.double()).abs() <= step).all())
            assert (got.double() - exact).abs().max() <= (kernel.double() - exact).abs().max() * 1.01 + 1e-6

