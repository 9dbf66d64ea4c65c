"""The builder of the engine's CPU C++ kernels (engine.kernels.cpu_extension.CpuKernel): a failed build warns once
with its reason, naming the kernel and what runs instead; V41VIZ_CPU_KERNELS=0 turns every kernel off; a build killed
half-way holds no later process up; checkouts of one source share its build."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from engine.kernels import cpu_norm, cpu_seam
from engine.kernels.cpu_extension import CpuKernel

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


HOLDER = """
import fcntl, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
handle = open(folder / "build.flock", "a")
fcntl.flock(handle, fcntl.LOCK_EX)
(folder / "lock").touch()        # torch's own lock, as a build in progress writes it
print("holding", flush=True)
time.sleep(600)
"""


def test_a_build_killed_half_way_holds_no_one_up(tmp_path, monkeypatch):
    """A process building a kernel is killed (SIGKILL) with torch's `lock` left in the folder: a process that was
    waiting for it goes on at once, removes the leftover (torch's builder would wait on it for ever) and builds."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    source = tmp_path / "k.cpp"
    source.write_text("int f() { return 1; }\n")
    kernel = CpuKernel("v41viz_probe", source, "probe kernel", "the Python path runs")
    folder = kernel.build_folder()
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        import torch.utils.cpp_extension as cpp_extension
        calls = []

        def fake_load(name, sources, build_directory, **kw):
            calls.append((sources, (Path(build_directory) / "lock").exists()))
            return "module"

        monkeypatch.setattr(cpp_extension, "load", fake_load)
        result = []
        waiter = threading.Thread(target=lambda: result.append(kernel.load()))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            waiter.start()
            waiter.join(1.0)
            assert waiter.is_alive() and not calls            # a build under way: waited for
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            waiter.join(10)
        assert not waiter.is_alive() and result == ["module"]
        assert calls == [([str(folder / "k.cpp")], False)]    # the leftover lock removed before the build
        assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
            f"removed {folder / 'lock'}, left by a build that did not finish; building again"]
    finally:
        holder.kill()
        holder.wait()


def test_two_checkouts_of_one_source_build_it_from_one_path(tmp_path, monkeypatch):
    """torch rebuilds an extension when a source's path changes: the same text from two checkouts (a worktree, a
    clone, the benchmark's older revision) is built from the copy in its cache folder, so neither rebuilds."""
    import torch.utils.cpp_extension as cpp_extension
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda name, sources, **kw: seen.append(sources) or "module")
    for checkout in ("a", "b"):
        source = tmp_path / checkout / "k.cpp"
        source.parent.mkdir()
        source.write_text("int f() { return 1; }\n")
        assert CpuKernel("v41viz_probe", source, "probe kernel", "the Python path runs").load() == "module"
    assert seen[0] == seen[1] and Path(seen[0][0]).read_text() == "int f() { return 1; }\n"
    assert Path(seen[0][0]).parent.parent == tmp_path / "cache"


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
