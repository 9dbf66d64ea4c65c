"""Running a script of scripts/ as a user would (a fresh interpreter in the repository root, output captured), or
loading it as a module to call its functions."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def script_runner(name: str, timeout: int = 300) -> Callable[..., subprocess.CompletedProcess]:
    """run(*args) for scripts/<name>: its exit code, stdout and stderr (text), killed after `timeout` seconds."""
    script = ROOT / "scripts" / name

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, check=False)
    return run


def script_module(name: str) -> ModuleType:
    """scripts/<name> loaded as a module (its main() not run), to call its functions."""
    path = ROOT / "scripts" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
