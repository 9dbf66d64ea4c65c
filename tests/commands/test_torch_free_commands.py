"""The commands that describe a config or the tokenizer, and every help text that needs no torch-backed options,
run without importing torch: each in a fresh process, torch looked for in sys.modules once it has finished."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Runs `python -m engine ARGV` in this process (output swallowed), then reports its exit code and whether torch
# (or anything under it) was imported.
CHILD = r"""
import contextlib, io, json, sys
from engine.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as e:   # --help exits through argparse
        code = e.code
print(json.dumps({"code": code, "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:5]}))
"""

TORCH_FREE = [
    ["--help"],
    ["info", "deepseek-v4.1-flash"],
    ["info", "tiny-v4.1", "--json"],
    ["tokenizer", "--text", "hi"],
    ["plan", "tiny-v4.1"],
    ["plan", "deepseek-v4.1-flash", "--gpus", "8"],
    ["plan", "deepseek-v4.1-flash", "--gpu-mem", "80", "--experts", "host"],
    ["plan", "deepseek-v4.1-flash", "--fit", "--gpu-mem", "80", "--host-mem", "512", "--json"],
    ["limits"],
    ["info", "--help"],
    ["tokenizer", "--help"],
    ["plan", "--help"],
    ["prepare_data", "--help"],
    ["quantize", "--help"],
    ["generate", "--help"],
    ["bench", "--help"],
]


@pytest.mark.parametrize("argv", TORCH_FREE, ids=" ".join)
def test_command_runs_without_torch(argv):
    run = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0, run.stderr[-3000:]
    assert seen["torch"] == [], f"python -m engine {' '.join(argv)} imported {seen['torch']}"


def test_plan_writes_its_results_file_without_torch(tmp_path):
    """`engine plan --results` records "not used" where a measurement names torch, and imports none."""
    path = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, "-c", CHILD, "plan", "tiny-v4.1", "--fit", "--results", str(path)],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"code": 0, "torch": []}, run.stderr[-3000:]
    results = json.loads(path.read_text(encoding="utf-8"))
    assert results["kind"] == "plan" and results["torch"] == "not used" and results["rows"]


def test_the_check_sees_torch_when_a_command_loads_it():
    """`card --help` builds options from torch-backed classes (engine.training.card): the same child reports torch."""
    run = subprocess.run([sys.executable, "-c", CHILD, "card", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=False, timeout=120)
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0 and "torch" in seen["torch"], run.stdout[-2000:] + run.stderr[-2000:]
