"""CpuKernel: one of the engine's CPU C++ kernels, compiled with PyTorch's extension builder, or why it could not be.

torch.utils.cpp_extension.load compiles a source once per machine and source text (a C++ compiler and ninja are
needed; about 20 s) into torch's extension cache, and later processes only load it (a fraction of a second).
scripts/setup.sh builds every kernel, so that no first forward waits for the compiler. Where a build fails the
engine keeps the kernel's Python path and says why once. V41VIZ_CPU_KERNELS=0 turns every kernel off."""
from __future__ import annotations

import functools
import os
import shutil
import warnings
from pathlib import Path
from types import ModuleType

FLAGS = ["-O2", "-ffp-contract=off"]   # no fused multiply-adds: the Python paths round every product


def disabled() -> bool:
    return os.environ.get("V41VIZ_CPU_KERNELS", "").strip().lower() in ("0", "false", "off", "no")


class CpuKernel:
    """The C++ source `source` built as extension `name`. load(): the built module (building it first if this
    machine has none for this source), or None when it is turned off or cannot be built; then unavailable_reason()
    says why, and a warning said so once per process, naming the kernel (`what`) and what runs instead
    (`fallback`). load is cached (later calls cost a dictionary lookup; load.cache_clear() forgets)."""

    def __init__(self, name: str, source: Path, what: str, fallback: str):
        self.name, self.source, self.what, self.fallback = name, source, what, fallback
        self.reason: str | None = "not loaded yet"
        self.load = functools.cache(self._build)

    def unavailable_reason(self) -> str | None:
        """None when the kernel is loaded, else why not."""
        return self.reason

    def _build(self) -> ModuleType | None:
        if disabled():
            self.reason = "turned off by V41VIZ_CPU_KERNELS=0"
            return None
        try:
            # cpp_extension pulls in setuptools and the build tools: only when the kernel is built
            from torch.utils.cpp_extension import load
            _find_ninja()
            module = load(self.name, sources=[str(self.source)], extra_cflags=FLAGS, verbose=False)
        except Exception as e:  # no compiler, no ninja, an unwritable cache: the Python path stays
            lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
            said = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"   # a compiler's output: its ends
            self.reason = f"{type(e).__name__}: {said}"
            warnings.warn(f"the {self.what} could not be built ({self.reason}); {self.fallback}", RuntimeWarning,
                          stacklevel=3)
            return None
        self.reason = None
        return module


def _find_ninja() -> None:
    """torch runs `ninja` from PATH; a virtual environment that is not activated has the pip package's binary
    (requirements.txt) outside it: put its folder on this process's PATH when PATH has no ninja."""
    if shutil.which("ninja") is None:
        try:
            # the ninja package is optional here: a ninja on PATH does as well
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
