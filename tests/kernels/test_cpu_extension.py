"""The builder of the engine's CPU C++ kernels (engine.kernels.cpu_extension.CpuKernel): a failed build warns once
with its reason, naming the kernel and what runs instead, and V41VIZ_CPU_KERNELS=0 turns every kernel off."""
from __future__ import annotations

import warnings

import pytest

from engine.kernels import cpu_norm, cpu_seam

KERNELS = [(cpu_seam, "v41viz_cpu_seam", "CPU mHC seam kernel"),
           (cpu_norm, "v41viz_cpu_norm", "CPU few-row RMSNorm kernel")]


@pytest.mark.parametrize("kernel, name, what", KERNELS)
def test_a_failed_build_warns_with_its_reason(kernel, name, what, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    def no_compiler(*args, **kw):
        raise RuntimeError(f"Error building extension '{name}'\nc++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    kernel.load.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kernel.load() is None
            assert kernel.load() is None                            # cached: one attempt, one warning
        reason = f"RuntimeError: Error building extension '{name}' … c++: not found"
        assert kernel.unavailable_reason() == reason
        assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
            f"the {what} could not be built ({reason}); {kernel.KERNEL.fallback}"]
    finally:
        monkeypatch.undo()
        kernel.load.cache_clear()
    assert kernel.load() is not None and kernel.unavailable_reason() is None   # the builder works again


@pytest.mark.parametrize("kernel, name, what", KERNELS)
def test_every_kernel_can_be_turned_off(kernel, name, what, monkeypatch):
    monkeypatch.setenv("V41VIZ_CPU_KERNELS", "0")
    kernel.load.cache_clear()
    try:
        assert kernel.load() is None
        assert kernel.unavailable_reason() == "turned off by V41VIZ_CPU_KERNELS=0"
    finally:
        kernel.load.cache_clear()
