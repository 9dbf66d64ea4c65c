"""scripts/bench_revision.py: the before/after table against HEAD, and a bad revision refused with no worktree left."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_revision.py"
NUMBER = r"[\d,]+\.\d"
RANGE = rf"({NUMBER}) \[({NUMBER})–({NUMBER})\]"
ROW = re.compile(rf"^(\S+)\s+(\d+)\s+(prefill|decode)\s+{RANGE}\s+{RANGE}\s+(\d+\.\d\d)\s+\[(\d+\.\d\d)–(\d+\.\d\d)\]$")


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)


def worktrees() -> str:
    return subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def temporary_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("bench-revision-*"))


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_head_against_the_working_tree_prints_a_table(tmp_path):
    before = worktrees()
    out = tmp_path / "runs.json"
    run = run_script("HEAD", "--configs", "tiny-v4.1", "--threads", "1", "--runs", "1", "--prompt-len", "4",
                     "--new-tokens", "3", "--repeats", "1", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert worktrees() == before
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"revisions: HEAD ({head}) against the working tree at {head}")
    assert lines[1].startswith("machine: ") and " cores; torch " in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("config "))
    assert lines[header].split() == ["config", "threads", "phase", "HEAD", f"({head})", "tokens/s", "working",
                                     "tree", "tokens/s", "ratio", "per-run", "ratios"]
    rows = [ROW.match(line) for line in lines[header + 1:]]
    assert all(rows) and [(r[1], r[2], r[3]) for r in rows] == [("tiny-v4.1", "1", "prefill"),
                                                                ("tiny-v4.1", "1", "decode")], run.stdout

    figures = json.loads(out.read_text())
    assert sorted(r["side"] for r in figures["runs"]) == ["rev", "tree"]
    for row, phase in zip(rows, ("prefill", "decode")):
        rates = {r["side"]: [r[phase]] for r in figures["runs"]}
        assert all(rate > 0 for side in rates for rate in rates[side]), rates
        ratio = statistics.median(rates["tree"]) / statistics.median(rates["rev"])
        table_row = next(t for t in figures["table"] if t["phase"] == phase)
        assert table_row["ratio"] == ratio
        assert row[10] == f"{ratio:.2f}"  # printed ratio: the ratio of the medians
        assert number(row[4]) == round(rates["rev"][0], 1) and number(row[7]) == round(rates["tree"][0], 1)
        assert row[11] == row[12] == f"{ratio:.2f}"  # one run: the per-run ratio range is that one pair's ratio


def test_a_bad_revision_is_named_and_leaves_no_worktree():
    before, folders = worktrees(), temporary_folders()
    run = run_script("no-such-revision-xyz", "--runs", "1")
    assert run.returncode == 2
    assert "error: revision 'no-such-revision-xyz' is not a commit" in run.stderr
    assert run.stdout == ""
    # a real commit whose engine has no `bench` (the first commit): the worktree is made, then removed on the error
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()[0]
    run = run_script(first, "--configs", "tiny-v4.1", "--threads", "1", "--runs", "1")
    assert run.returncode == 2
    assert f"error: the engine at {first[:7]} has no usable `python -m engine bench`" in run.stderr, run.stderr
    assert worktrees() == before
    assert temporary_folders() <= folders
