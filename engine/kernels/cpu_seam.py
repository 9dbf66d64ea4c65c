"""The CPU C++ kernel of an mHC seam's few-token mixes (cpu_seam.cpp), built with PyTorch's extension builder.

torch.utils.cpp_extension.load compiles it once per machine and source (a C++ compiler and ninja are needed; about
20 s) into torch's extension cache, and later processes only load it (a fraction of a second), on the first
few-token seam a process runs on the CPU. scripts/setup.sh builds it, so that first forward does not wait for the
compiler. Where the build fails the engine keeps the Python-float path, which gives the same bits
(engine.speedups.fast_mhc), and says why once. V41VIZ_CPU_KERNELS=0 turns the kernel off."""
from __future__ import annotations

import functools
import os
import shutil
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_suffix(".cpp")
NAME = "v41viz_cpu_seam"
FLAGS = ["-O2", "-ffp-contract=off"]   # no fused multiply-adds: the Python path rounds every product
_reason = "not loaded yet"


def disabled() -> bool:
    return os.environ.get("V41VIZ_CPU_KERNELS", "").strip().lower() in ("0", "false", "off", "no")


@functools.cache
def load():
    """The built extension module (building it first if this machine has none for this source), or None when it
    is turned off or cannot be built (unavailable_reason says why; a warning says so once per process). Cached:
    later calls cost a dictionary lookup."""
    global _reason
    if disabled():
        _reason = "turned off by V41VIZ_CPU_KERNELS=0"
        return None
    try:
        from torch.utils.cpp_extension import load as build
        _find_ninja()
        module = build(NAME, sources=[str(SOURCE)], extra_cflags=FLAGS, verbose=False)
    except Exception as e:  # no compiler, no ninja, an unwritable cache: the Python path stays
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
        said = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"   # a compiler's output: its ends
        _reason = f"{type(e).__name__}: {said}"
        warnings.warn(f"the CPU mHC seam kernel could not be built ({_reason}); few-token seams run on Python "
                      "floats (same results, slower)", RuntimeWarning, stacklevel=2)
        return None
    _reason = None
    return module


def _find_ninja() -> None:
    """torch runs `ninja` from PATH; a virtual environment that is not activated has the pip package's binary
    (requirements.txt) outside it: put its folder on this process's PATH when PATH has no ninja."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def unavailable_reason() -> str | None:
    """None when the kernel is loaded, else why not."""
    return _reason
