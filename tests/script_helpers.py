"""Running a script of scripts/ as a user would: a fresh interpreter in the repository root, output captured."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def script_runner(name: str, timeout: int = 300) -> Callable[..., subprocess.CompletedProcess]:
    """run(*args) for scripts/<name>: its exit code, stdout and stderr (text), killed after `timeout` seconds."""
    script = ROOT / "scripts" / name

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, check=False)
    return run
