"""The linter: `ruff check .` under pyproject.toml's [tool.ruff] rules finds nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", ".", "--no-cache"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"ruff check . found:\n{run.stdout}{run.stderr}"
