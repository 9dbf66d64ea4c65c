"""The full-width rehearsal folder (configs/v4.1-flash-rehearsal.json, synthetic official weights) under torchrun
with 2 gloo ranks generates one process's greedy text, fp32: heads (64), output groups (8), experts (8) and the
vocabulary (129,280) split in two at the release's widths."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.official_helpers import ROOT, rehearsal_folder
from tests.parallel_helpers import torchrun

# one process (9.5 GiB) and then 2 ranks load the full-width model and generate 3 tokens [222 s on 2 cores; the
# 6.2 GiB folder is written once on first use, minutes]
pytestmark = [pytest.mark.slow, pytest.mark.full_width]


def test_two_ranks_generate_one_process_text(tmp_path):
    folder = rehearsal_folder()
    argv = ["-m", "engine", "generate", "--checkpoint", str(folder), "--prompt", "The king of the north",
            "--max-new-tokens", "3"]
    alone = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False,
                           timeout=600)
    assert alone.returncode == 0, alone.stderr[-3000:]
    run, errs = torchrun(2, argv, tmp_path, timeout_s=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone.stdout and alone.stdout.strip()              # rank 0's stdout, once
    assert errs[0].count("split over 2 ranks") == 1 and errs[1] == ""
