"""The CPU C++ kernel of the few-token mHC seams (engine.kernels.cpu_seam): it builds on a machine like CI's, gives
the Python-float path's bits (so the fast paths' tests against the reference hold for both), refuses malformed
inputs by name, and where it is not built the Python path runs."""
from __future__ import annotations

import types

import pytest
import torch

from engine.kernels import cpu_seam
from engine.speedups import fast_mhc
from tests import model_helpers
from tests.model_helpers import decode_logits


def kernel():
    module = cpu_seam.load()
    assert module is not None, f"the CPU seam kernel did not build here: {cpu_seam.unavailable_reason()}"
    return module


def fake_block(iters: int = 20):
    """What _few_tokens reads of a block."""
    return types.SimpleNamespace(iters=iters, hc_eps=1e-6, norm_eps=1e-20)


def seam_inputs(n: int, hc: int, dtype, g: torch.Generator, spread: float = 3.0):
    width = hc * 16
    mixes = (torch.randn(n, 2 * hc + hc * hc, generator=g, dtype=torch.float64) * spread).to(dtype)
    norms = (torch.rand(n, generator=g, dtype=torch.float64) * 40 + 0.5).to(dtype)
    scale = torch.rand(3, generator=g, dtype=torch.float64).to(dtype) + 0.5
    base = torch.randn(2 * hc + hc * hc, generator=g, dtype=torch.float64).to(dtype)
    return mixes, norms, scale, base, width


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hc", [2, 3, 4])
def test_kernel_gives_the_python_float_paths_bits(dtype, hc):
    module, g = kernel(), torch.Generator().manual_seed(hc)
    for n in (1, 2, 6, 8):
        for iters in (1, 2, 20):
            block = fake_block(iters)
            mixes, norms, scale, base, width = seam_inputs(n, hc, dtype, g)
            want = fast_mhc._python_floats(block, mixes, norms, scale, base, "attn", hc, width)
            got = module.seam_mixes(mixes, norms, scale.double(), base.double(), hc, width, iters, block.hc_eps,
                                    block.norm_eps)
            assert got.dtype == dtype and got.shape == want.shape
            assert torch.equal(got, want), (n, iters)


def test_kernel_matches_python_at_extreme_and_non_finite_inputs():
    """Logits far out (exp's range ends, sigmoid saturating on both sides) give the same bits; a NaN reaches the
    same entries on both paths instead of being hidden by one of them."""
    module, hc = kernel(), 4
    g = torch.Generator().manual_seed(3)
    mixes, norms, scale, base, width = seam_inputs(4, hc, torch.float32, g, spread=400.0)
    mixes[2, 9] = float("nan")
    block = fake_block()
    want = fast_mhc._python_floats(block, mixes, norms, scale, base, "ffn", hc, width)
    got = module.seam_mixes(mixes, norms, scale.double(), base.double(), hc, width, 20, 1e-6, 1e-20)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_kernel_refuses_malformed_inputs_by_name():
    module, hc = kernel(), 4
    mixes, norms, scale, base, width = seam_inputs(3, hc, torch.float32, torch.Generator().manual_seed(0))
    s, b = scale.double(), base.double()
    cases = {
        "mixes must be float32 or float64": (mixes.half(), norms, s, b),
        "norms must have the dtype of mixes": (mixes, norms.double(), s, b),
        "mixes must be contiguous [n, 2hc + hc^2]": (mixes[:, :-1], norms, s, b),
        "norms must be contiguous [n]": (mixes, norms[:2], s, b),
        "scale must be 3 contiguous float64 values": (mixes, norms, scale, b),
        "base must be 2hc + hc^2 contiguous float64 values": (mixes, norms, s, b[:-1]),
    }
    for message, inputs in cases.items():
        with pytest.raises(RuntimeError, match=message.replace("^", r"\^").replace("[", r"\[").replace("+", r"\+")):
            module.seam_mixes(*inputs, hc, width, 20, 1e-6, 1e-20)
    with pytest.raises(RuntimeError, match="CPU tensors only"):
        module.seam_mixes(mixes.to("meta"), norms.to("meta"), s, b, hc, width, 20, 1e-6, 1e-20)


def tiny_model(dtype=torch.float32):
    return model_helpers.tiny_model(dtype, vocab_size=512, dspark_noise_token_id=511)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_model_decodes_the_same_bits_with_the_kernel_and_on_python_floats(dtype, monkeypatch):
    model = tiny_model(dtype)
    tokens = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(1))
    calls = []
    real = kernel()
    monkeypatch.setattr(cpu_seam, "load", lambda: calls.append(1) or real)
    with_kernel = decode_logits(model, tokens)
    forwards = 2 + tokens.size(1) - 11                   # the prefill, the block, then one token at a time
    assert len(calls) == forwards * 2 * model.args.n_layers   # every layer's two seams in every forward
    monkeypatch.setattr(cpu_seam, "load", lambda: None)
    assert torch.equal(decode_logits(model, tokens), with_kernel)


def test_without_the_kernel_the_python_path_runs(monkeypatch):
    """Where the kernel did not build (engine.kernels.cpu_extension, tests/kernels/test_cpu_extension.py) the seams
    run on Python floats."""
    monkeypatch.setattr(cpu_seam, "load", lambda: None)
    logits = decode_logits(tiny_model(), torch.randint(3, 500, (1, 13), generator=torch.Generator().manual_seed(2)))
    assert logits.isfinite().all()
