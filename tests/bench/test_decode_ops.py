"""scripts/decode_ops.py: per-step aten op counts of eager decode for each dtype asked for; bad arguments refused
with a message."""
from __future__ import annotations

import re

from tests.script_helpers import script_runner

run_script = script_runner("decode_ops.py")


def test_counts_the_ops_of_a_decode_step_per_dtype(tmp_path):
    out = run_script("--steps", "2", "--top", "40", "--results", str(tmp_path / "ops.json"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tiny-v4.1: aten ops per eager decode step") and "2 profiled steps" in lines[0]
    assert lines[1].split() == ["op", "float32", "calls", "float32", "µs", "bfloat16", "calls", "bfloat16", "µs"]
    rows = [re.fullmatch(r"(aten::\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", line) for line in lines[2:-1]]
    assert len(rows) == 40 and all(rows), lines
    total = re.fullmatch(r"all aten ops\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", lines[-1])
    assert total, lines[-1]
    for row in rows:                                    # each kind is part of the total
        assert int(row[2]) <= int(total[1]) and int(row[4]) <= int(total[3])
    # bf16 rounds at the reference's points (each product's input and output): more conversions per step
    counts = {r[1]: (int(r[2]), int(r[4])) for r in rows}
    assert int(total[3]) > int(total[1])
    assert counts["aten::_to_copy"][1] > counts["aten::_to_copy"][0]
    from engine.bench.results_file import load  # the results file holds the printed rows, the total last
    results = load(tmp_path / "ops.json")
    assert [r["op"] for r in results["rows"]] == [r[1] for r in rows] + ["all aten ops"]
    assert f"{results['rows'][-1]['bfloat16']['calls']:.0f}" == total[3] and results["settings"]["steps"] == 2


def test_bad_arguments_are_refused():
    for args in (("--dtypes", "float16"), ("--dtypes", "float32,float32"), ("--steps", "0")):
        out = run_script(*args)
        assert out.returncode == 2 and "error:" in out.stderr, args
    out = run_script("--config", "no-such-preset")
    assert out.returncode == 2 and "no-such-preset" in out.stderr
    out = run_script("--steps", "100000")                     # beyond the model's max_seq_len
    assert out.returncode == 2 and "max_seq_len" in out.stderr and "Traceback" not in out.stderr
