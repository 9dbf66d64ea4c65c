"""scripts/rehearsal.py with a small prompt: the release's widths (configs/v4.1-flash-rehearsal.json) loaded lazily
from a synthetic official folder in a fresh process, prefilled, decoded plainly and with DSpark; the measured peak
RSS within 15 % of the memory plan's figure for a CPU run (engine.plan.host_run)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.official_helpers import rehearsal_folder

# a 9.5 GiB full-width model loaded in a fresh process, 64-token prompt, 2 + 2 decode steps: every forward
# dequantizes ~2 G FP8 / FP4 values on the CPU [203 s on 2 cores; the 6.2 GiB folder it reads is
# written once on first use, ~16 min]
pytestmark = [pytest.mark.slow, pytest.mark.full_width]

ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS / VmHWM from /proc")
def test_rehearsal_runs_at_full_width_within_the_plan(tmp_path):
    folder = rehearsal_folder()
    results = tmp_path / "rehearsal.json"
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "scripts/rehearsal.py", "--folder", str(folder), "--prompt", "64",
                          "--decode", "2", "--contexts", "", "--results", str(results)],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=1200)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-4000:]
    print(f"\n{run.stderr.strip()}\n({seconds:.0f} s)")
    row = json.loads(results.read_text())["rows"][0]
    assert row["tokens"] == 64 and row["prefill_tokens_per_s"] > 0 and row["decode_ms"] > 0
    assert row["dspark_decode_ms"] > 0 and row["dspark_same_tokens"]   # greedy: DSpark changes speed, not text
    grew, planned = row["peak"] - row["base"], row["predicted"]["total"]
    assert abs(grew - planned) <= 0.15 * planned, f"peak {grew / GIB:.2f} GiB vs plan {planned / GIB:.2f} GiB"
