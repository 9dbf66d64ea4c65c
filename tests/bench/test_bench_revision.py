"""scripts/bench_revision.py: the before/after table against HEAD (and the bfloat16 one), the compiled row's
arithmetic, and a bad revision refused with no worktree left."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.script_helpers import ROOT, script_module, script_runner

SCRIPT = ROOT / "scripts" / "bench_revision.py"
NUMBER = r"[\d,]+\.\d"
RANGE = rf"({NUMBER}) \[({NUMBER})–({NUMBER})\]"
ROW = re.compile(rf"^(\S+)\s+(\d+)\s+(prefill|decode)\s+{RANGE}\s+{RANGE}\s+(\d+\.\d\d)\s+\[(\d+\.\d\d)–(\d+\.\d\d)\]$")


run_script = script_runner("bench_revision.py", timeout=600)


def worktrees() -> str:
    return subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def temporary_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("bench-revision-*"))


def number(text: str) -> float:
    return float(text.replace(",", ""))


# a git worktree of HEAD; `engine bench` and `bench --help` twice, fresh processes importing torch [12-25 s]
@pytest.mark.slow
def test_head_against_the_working_tree_prints_a_table(tmp_path):
    before = worktrees()
    out = tmp_path / "runs.json"
    run = run_script("HEAD", "--configs", "tiny-v4.1", "--threads", "1", "--runs", "1", "--prompt-len", "4",
                     "--new-tokens", "3", "--repeats", "1", "--bf16", "--json", str(out), "--results",
                     str(tmp_path / "revision.json"))
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
    end = lines.index("", header)
    rows = [ROW.match(line) for line in lines[header + 1:end]]
    assert all(rows) and [(r[1], r[2], r[3]) for r in rows] == [("tiny-v4.1", "1", "prefill"),
                                                                ("tiny-v4.1", "1", "decode")], run.stdout

    figures = json.loads(out.read_text())
    from engine.bench.results_file import load
    results = load(tmp_path / "revision.json")        # the results file: the same tables as the --json one
    assert results["rows"] == figures["table"] and results["tables"]["bf16"] == figures["bf16_table"]
    assert results["tables"]["trace_overhead"] == figures["trace_overhead"] and results["threads"] == [1]
    assert sorted(r["side"] for r in figures["runs"]) == ["rev", "tree", "tree_bf16"]
    assert [r["bench"]["dtype"] for r in figures["runs"] if r["side"] != "rev"] in (["float32", "bfloat16"],
                                                                                     ["bfloat16", "float32"])
    for row, phase in zip(rows, ("prefill", "decode")):
        rates = {r["side"]: [r[phase]] for r in figures["runs"]}
        assert all(rate > 0 for side in rates for rate in rates[side]), rates
        ratio = statistics.median(rates["tree"]) / statistics.median(rates["rev"])
        table_row = next(t for t in figures["table"] if t["phase"] == phase)
        assert table_row["ratio"] == ratio
        assert row[10] == f"{ratio:.2f}"  # printed ratio: the ratio of the medians
        assert number(row[4]) == round(rates["rev"][0], 1) and number(row[7]) == round(rates["tree"][0], 1)
        assert row[11] == row[12] == f"{ratio:.2f}"  # one run: the per-run ratio range is that one pair's ratio

    # each side's trace overhead on decode, as its launch's `engine bench` reported it (one run: min = median = max)
    title = next(i for i, line in enumerate(lines) if line.startswith("trace overhead on decode, each side's own"))
    assert lines[title + 2].split() == ["config", "threads", "HEAD", f"({head})", "trace", "overhead", "working",
                                        "tree", "trace", "overhead"]
    cells = re.findall(r"x(\d+\.\d\d) \[x(\d+\.\d\d)–x(\d+\.\d\d)\]", lines[title + 3])
    assert lines[title + 3].startswith("tiny-v4.1  1 ") and len(cells) == 2, lines[title + 3]
    for cell, side in zip(cells, ("rev", "tree")):
        overhead = next(r["bench"]["trace_overhead_decode"] for r in figures["runs"] if r["side"] == side)
        assert overhead > 0 and cell == (f"{overhead:.2f}",) * 3
    assert figures["trace_overhead"][0]["tree"]["median"] == next(
        r["bench"]["trace_overhead_decode"] for r in figures["runs"] if r["side"] == "tree")

    # the second table: the working tree's bfloat16 launch against its float32 one, from the same run
    second = lines.index("bfloat16 against float32, both the working tree, the same runs; ratio: bfloat16 / float32")
    header = next(i for i in range(second, len(lines)) if lines[i].startswith("config "))
    assert lines[header].split()[3:7] == ["float32", "tokens/s", "bfloat16", "tokens/s"]
    bf16_rows = [ROW.match(line) for line in lines[header + 1:]]
    assert all(bf16_rows) and [r[3] for r in bf16_rows] == ["prefill", "decode"], run.stdout
    for row, phase in zip(bf16_rows, ("prefill", "decode")):
        rates = {r["side"]: r[phase] for r in figures["runs"]}
        assert row[10] == f"{rates['tree_bf16'] / rates['tree']:.2f}"
        assert number(row[4]) == round(rates["tree"], 1) and number(row[7]) == round(rates["tree_bf16"], 1)


def load_script():
    return script_module("bench_revision.py")


def test_the_compiled_row_sets_the_working_trees_compiled_decode_against_the_revisions_eager_decode(monkeypatch):
    """With --compile only the working tree's launches get `--compile`; its row divides the compiled decode by the
    revision's eager decode, run by run (launch results stand in for `engine bench`, whose compile is tested in
    test_speedups_fast)."""
    script = load_script()
    a = script.parse_arguments(["HEAD", "--configs", "tiny-v4.1", "--threads", "1", "--runs", "2", "--compile"])
    commands = []
    decode = {("rev", 0): 10.0, ("tree", 0): 20.0, ("rev", 1): 12.0, ("tree", 1): 18.0}
    compiled = {0: 50.0, 1: 60.0}

    def fake_measure(tree, label, command, threads):
        side = "rev" if label == "REV" else "tree"
        run = sum(1 for c in commands if c[0] == side)
        commands.append((side, command))
        result = {"prefill_tokens_per_s": 100.0, "decode_tokens_per_s": decode[side, run]}
        if "--compile" in command:
            result["compile"] = {"decode_tokens_per_s_compiled": compiled[run], "first_compiled_step_s": 3.0 + run}
        return result

    monkeypatch.setattr(script, "measure", fake_measure)
    flags = {side: {"--dtype"} for side in ("rev", "tree")}
    records = script.interleaved_runs({"rev": ROOT, "tree": ROOT}, {"rev": "REV", "tree": "tree"}, flags, a)
    assert [("--compile" in c) for side, c in commands if side == "rev"] == [False, False]
    assert [("--compile" in c) for side, c in commands if side == "tree"] == [True, True]
    rows = {r["phase"]: r for r in script.summary_rows(records, a, compiled=True)}
    assert list(rows) == ["prefill", "decode", script.COMPILED]
    row = rows[script.COMPILED]
    assert row["base_median"] == 11.0 and row["other_median"] == 55.0 and row["ratio"] == 5.0
    assert (row["pair_ratio_min"], row["pair_ratio_max"]) == (5.0, 5.0)   # 50 / 10 and 60 / 12
    assert rows["decode"]["ratio"] == 19.0 / 11.0


def test_with_bf16_the_bfloat16_side_compiles_too_and_its_row_sets_compiled_against_compiled(monkeypatch):
    """--compile --bf16: the bfloat16 launches get `--compile` as well, and the bfloat16 table's compiled row divides
    the bfloat16 compiled decode by the float32 compiled decode of the same run."""
    script = load_script()
    a = script.parse_arguments(["HEAD", "--configs", "tiny-v4.1", "--threads", "1", "--runs", "2", "--compile",
                                "--bf16"])
    commands = []
    compiled = {("tree", 0): 40.0, ("tree", 1): 50.0, ("tree_bf16", 0): 60.0, ("tree_bf16", 1): 55.0}

    def fake_measure(tree, label, command, threads):
        side = {"REV": "rev", "tree": "tree", "tree bf16": "tree_bf16"}[label]
        run = sum(1 for c in commands if c[0] == side)
        commands.append((side, command))
        result = {"prefill_tokens_per_s": 100.0, "decode_tokens_per_s": 10.0}
        if "--compile" in command:
            result["compile"] = {"decode_tokens_per_s_compiled": compiled[side, run], "first_compiled_step_s": 3.0}
        return result

    monkeypatch.setattr(script, "measure", fake_measure)
    flags = {side: {"--dtype"} for side in ("rev", "tree", "tree_bf16")}
    records = script.interleaved_runs({side: ROOT for side in flags},
                                      {"rev": "REV", "tree": "tree", "tree_bf16": "tree bf16"}, flags, a)
    assert {side: [("--compile" in c) for s, c in commands if s == side] for side in flags} == \
        {"rev": [False, False], "tree": [True, True], "tree_bf16": [True, True]}
    assert all("bfloat16" in c for side, c in commands if side == "tree_bf16")
    rows = {r["phase"]: r for r in script.summary_rows(records, a, base="tree", other="tree_bf16", compiled=True,
                                                       base_compiled=True)}
    row = rows[script.COMPILED]
    assert row["base_median"] == 45.0 and row["other_median"] == 57.5 and row["ratio"] == 57.5 / 45.0
    assert (row["pair_ratio_min"], row["pair_ratio_max"]) == (1.1, 1.5)   # 55 / 50 and 60 / 40


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
