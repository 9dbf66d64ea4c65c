"""Shared set-up of the Triton kernel tests: interpreter on CPU or native on CUDA, dtype-scaled comparisons."""
from __future__ import annotations

import os

import pytest
import torch

# Natively on a GPU unless TRITON_INTERPRET=1 asks for the interpreter; on a CPU-only machine always the
# interpreter. Decided before any kernel module is imported, because triton.jit reads it at decoration.
NATIVE = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "").strip() not in ("1", "true", "on")
if not NATIVE:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton",
                    reason="the 'triton' package is not installed or does not import: kernel tests cannot run",
                    exc_type=ImportError)

DEVICE = torch.device("cuda" if NATIVE else "cpu")
torch.set_num_threads(1)

# Each test runs in the mode this process can execute; the other mode shows up as a skip with its reason.
MODES = [
    pytest.param("interpreter", marks=pytest.mark.skipif(
        NATIVE, reason="this run executes the kernels natively on CUDA; the interpreter variant runs with "
                       "TRITON_INTERPRET=1 (scripts/gpu_check.sh does both)")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not NATIVE, reason="no CUDA device here: the native-CUDA variant is not run, only the interpreter one")),
]

# bf16 tl.dot is wrong in the interpreter: kernels with matrix products are tested in fp32/fp16 there.
DOT_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if NATIVE else [])
# tolerance relative to (1 + |reference|): a few ulps of the compute dtype, times the reduction depth
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    g, w = got.double().cpu(), want.double().cpu()
    diff = (g - w).abs()
    bound = tol * (1 + w.abs())
    if not bool((diff <= bound).all()):
        worst = int((diff - bound).flatten().argmax())
        raise AssertionError(f"{what}: max |diff| {diff.max().item():.3g}; worst element #{worst}: got "
                             f"{g.flatten()[worst].item():.6g}, reference {w.flatten()[worst].item():.6g}, "
                             f"allowed {bound.flatten()[worst].item():.3g} (tol {tol:g}·(1+|ref|))")


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Exact equality for pure data movement and selections."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    same = got.cpu() == want.cpu()
    if not bool(same.all()):
        bad = int((~same).sum())
        diff = (got.cpu().double() - want.cpu().double()).abs().max().item()
        raise AssertionError(f"{what}: {bad} of {same.numel()} elements differ (max |diff| {diff:.3g}); expected exact")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    """Random normal tensor made on the CPU (identical in every mode), then moved to the test device."""
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(dtype=dtype, device=DEVICE)
