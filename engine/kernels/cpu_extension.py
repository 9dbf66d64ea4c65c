"""CpuKernel: one of the engine's CPU C++ kernels, compiled with PyTorch's extension builder, or why it could not be.

torch.utils.cpp_extension.load compiles a source once per machine and source text (a C++ compiler and ninja are
needed; about 20 s) into torch's extension cache, and later processes only load it (a fraction of a second).
scripts/setup.sh builds every kernel, so that no first forward waits for the compiler. Where a build fails the
engine keeps the kernel's Python path and says why once. V41VIZ_CPU_KERNELS=0 turns every kernel off.

Each source text builds in its own folder of the cache (NAME-<sha256 of the source>), from a copy of the source kept in
that folder: two checkouts or versions of the same text share one build and never rebuild over each other (torch
rebuilds when a source's path changes). Builds are serialised by an fcntl lock on `build.flock` in the folder, which
the kernel releases when its holder exits, however it ends. torch's builder keeps its own `lock` file while it compiles
and a process that finds one waits for it with no limit; a build killed half-way (Ctrl-C, a timeout, a server stopped)
leaves it behind. A process holding the fcntl lock knows no build is under way, so a `lock` it finds is such a
leftover: it is removed, with a warning that names it."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
            folder = self.build_folder()
            folder.mkdir(parents=True, exist_ok=True)
            with build_lock(folder):
                source = folder / self.source.name
                if not source.exists():
                    staged = folder / f"{self.source.name}.part"
                    shutil.copyfile(self.source, staged)
                    staged.replace(source)
                module = load(self.name, sources=[str(source)], extra_cflags=FLAGS, verbose=False,
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


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold the build folder's fcntl lock (waiting while another process builds or loads there); torch's `lock` file
    found inside is a killed build's leftover, removed with a warning. (No fcntl, as on Windows: the ImportError
    keeps the Python path.)"""
    import fcntl
    with open(folder / "build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            leftover = folder / "lock"
            if leftover.exists():
                leftover.unlink(missing_ok=True)
                warnings.warn(f"removed {leftover}, left by a build that did not finish; building again",
                              RuntimeWarning, stacklevel=3)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
