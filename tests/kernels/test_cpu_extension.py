"""The builder of the engine's CPU C++ kernels (engine.kernels.cpu_extension.CpuKernel): a failed build warns once
with its reason, naming the kernel and what runs instead, and V41VIZ_CPU_KERNELS=0 turns every kernel off."""
from __future__ import annotations

import warnings

import pytest

from engine.kernels import cpu_norm, cpu_seam
from engine.kernels.cpu_extension import STALE_LOCK_S, CpuKernel, clear_stale_lock, wait_out_lock

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


def test_a_killed_builds_lock_is_removed_and_a_live_one_kept(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    now = lock.stat().st_mtime
    assert not clear_stale_lock(tmp_path, now + STALE_LOCK_S) and lock.exists()      # a build under way: wait for it
    with pytest.warns(RuntimeWarning, match="left 11 minutes ago by a build that did not finish"):
        assert clear_stale_lock(tmp_path, now + STALE_LOCK_S + 60)
    assert not lock.exists()
    assert not clear_stale_lock(tmp_path, now)                                        # nothing there: nothing to do


def test_a_young_lock_left_behind_is_waited_out_for_a_bounded_time(tmp_path):
    """A lock a killed build left a minute ago: the process waits, then removes it once it is STALE_LOCK_S old
    (torch's own wait would never end); a lock whose build finishes meanwhile ends the wait with it."""
    lock = tmp_path / "lock"
    lock.touch()
    clock = [lock.stat().st_mtime + 60]
    slept = []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    with pytest.warns(RuntimeWarning, match="did not finish"):
        wait_out_lock(tmp_path, poll_s=30, clock=lambda: clock[0], sleep=sleep)
    assert not lock.exists() and STALE_LOCK_S - 60 <= sum(slept) <= STALE_LOCK_S
    lock.touch()
    wait_out_lock(tmp_path, poll_s=1, clock=lambda: clock[0], sleep=lambda s: lock.unlink())   # a live build ends
    assert not lock.exists()


def test_each_source_text_builds_in_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    source = tmp_path / "k.cpp"
    source.write_text("int f() { return 1; }\n")
    kernel = CpuKernel("v41viz_probe", source, "probe kernel", "the Python path runs")
    first = kernel.build_folder()
    source.write_text("int f() { return 2; }\n")
    second = kernel.build_folder()
    assert first.parent == second.parent == tmp_path and first != second
    assert first.name.startswith("v41viz_probe-")
