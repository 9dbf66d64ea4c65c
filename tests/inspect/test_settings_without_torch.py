"""The Inspect settings, links and what-if forms are checked without torch: a fresh process validates them and
torch stays out of sys.modules (only the run on an engine, v41viz.inspect.engine_run, loads it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from engine.spec.errors import InputError
from v41viz.inspect import url, what_if
from v41viz.inspect.run import GenSettings
GenSettings("ROMEO:", temperature=1.0, seed=3, interventions=("ban-expert:3:5@12",)).check()
for bad in (GenSettings("ROMEO:", temperature=-1.0), GenSettings("ROMEO:", top_p=2.0),
            GenSettings("ROMEO:", schedule="fast"), GenSettings("ROMEO:", interventions=("no-such:1",))):
    try:
        bad.check()
    except InputError:
        continue
    raise SystemExit(f"not refused: {bad}")
print('torch' in sys.modules)
"""


def test_inspect_settings_are_checked_without_torch():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", out.stderr
