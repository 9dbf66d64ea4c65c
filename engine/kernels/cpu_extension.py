"""CpuKernel: one of the engine's CPU C++ kernels, compiled with PyTorch's extension builder, or why it could not be.

torch.utils.cpp_extension.load compiles a source once per machine and source text (a C++ compiler and ninja are
needed; about 20 s) into torch's extension cache, and later processes only load it (a fraction of a second).
scripts/setup.sh builds every kernel, so that no first forward waits for the compiler. Where a build fails the
engine keeps the kernel's Python path and says why once. V41VIZ_CPU_KERNELS=0 turns every kernel off.

Each source text builds in its own folder of the cache (NAME-<sha256 of the source>), so two checkouts or versions
never rebuild over each other. torch's builder holds a `lock` file while it compiles and a process that finds one
waits until it goes; a build killed half-way (Ctrl-C, a timeout) leaves it behind, and every later process would
wait forever. A lock older than STALE_LOCK_S, many times a build's length, is such a leftover: it is removed, with a
warning that names it; a process that finds a younger one waits until it goes or grows that old (wait_out_lock)."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import time
import warnings
from pathlib import Path
from types import ModuleType

FLAGS = ["-O2", "-ffp-contract=off"]   # no fused multiply-adds: the Python paths round every product
STALE_LOCK_S = 600                     # a build takes about 20 s (a minute on a loaded 2-core machine)


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
            folder = self.build_folder()
            folder.mkdir(parents=True, exist_ok=True)
            wait_out_lock(folder)
            module = load(self.name, sources=[str(self.source)], extra_cflags=FLAGS, verbose=False,
                          build_directory=str(folder))
        except Exception as e:  # no compiler, no ninja, an unwritable cache: the Python path stays
            lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
            said = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"   # a compiler's output: its ends
            self.reason = f"{type(e).__name__}: {said}"
            warnings.warn(f"the {self.what} could not be built ({self.reason}); {self.fallback}", RuntimeWarning,
                          stacklevel=3)
            return None
        self.reason = None
        return module

    def build_folder(self) -> Path:
        """This source text's folder in torch's cache (TORCH_EXTENSIONS_DIR, or ~/.cache/torch_extensions)."""
        digest = hashlib.sha256(self.source.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
        return Path(root) / f"{self.name}-{digest}"


def clear_stale_lock(folder: Path, now: float | None = None) -> bool:
    """Remove the builder's `lock` in `folder` when it is older than STALE_LOCK_S (a killed build's leftover);
    True if one was removed. A younger lock is a build under way elsewhere: left for the builder to wait on."""
    lock = folder / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age <= STALE_LOCK_S:
        return False
    lock.unlink(missing_ok=True)
    warnings.warn(f"removed {lock}, left {age / 60:.0f} minutes ago by a build that did not finish; building again",
                  RuntimeWarning, stacklevel=2)
    return True


def wait_out_lock(folder: Path, poll_s: float = 2.0, clock=time.time, sleep=time.sleep) -> None:
    """Return once `folder` has no builder's `lock`: another process's build finished (its lock removed), or the
    lock grew older than STALE_LOCK_S and clear_stale_lock removed it. torch's builder, finding a lock, waits for
    it with no limit, so a lock left by a build killed a minute ago would hold this process for ever; waiting here
    first bounds that at STALE_LOCK_S."""
    while (folder / "lock").exists() and not clear_stale_lock(folder, clock()):
        sleep(poll_s)


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
