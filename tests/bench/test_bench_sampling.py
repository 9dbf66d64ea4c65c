"""scripts/bench_sampling.py: one row per vocabulary size, both ways timed, the ratio theirs; malformed arguments
refused with a message."""
from __future__ import annotations

import re

from tests.script_helpers import script_runner

CELL = r"\s+([\d.]+) \[\s*([\d.]+)–\s*([\d.]+)\]"
ROW = re.compile(rf"^\s*(\d+){CELL}{CELL}  ×(\d+\.\d\d\d)$")

run_script = script_runner("bench_sampling.py")


def test_the_table_has_every_vocabulary_size():
    out = run_script("--vocab", "50,20000", "--rounds", "2", "--seconds", "0.005")
    assert out.returncode == 0, out.stderr
    assert "2 interleaved rounds" in out.stdout and "1 thread(s)" in out.stdout
    rows = [m for m in map(ROW.match, out.stdout.splitlines()) if m]
    assert [int(m[1]) for m in rows] == [50, 20000]                 # one running sum, and blocks
    for m in rows:
        multinomial, ours = [tuple(float(v) for v in m.groups()[1 + 3 * i:4 + 3 * i]) for i in range(2)]
        for med, low, high in (multinomial, ours):
            assert 0 < low <= med <= high
        ratio, (a, b) = float(m[8]), (ours[0], multinomial[0])   # medians printed to 0.1 µs, the ratio to 0.001
        assert (a - 0.05) / (b + 0.05) - 5e-4 <= ratio <= (a + 0.05) / (b - 0.05) + 5e-4


def test_results_file_holds_the_rows_the_table_prints(tmp_path):
    from engine.bench.results_file import load
    path = tmp_path / "sampling.json"
    out = run_script("--vocab", "50,300", "--rounds", "3", "--seconds", "0.002", "--results", str(path))
    assert out.returncode == 0, out.stderr
    results = load(path)
    assert results["kind"] == "sampling" and results["threads"] == 1 and results["settings"]["rounds"] == 3
    assert results["command"] == f"python scripts/bench_sampling.py --vocab 50,300 --rounds 3 --seconds 0.002 " \
                                 f"--results {path}"
    printed = {int(m[1]): m for m in map(ROW.match, out.stdout.splitlines()) if m}
    assert [row["vocabulary"] for row in results["rows"]] == [50, 300]
    for row in results["rows"]:
        m = printed[row["vocabulary"]]
        assert f"{row['multinomial_us']['median']:.1f}" == m[2] and f"{row['sample_index_us']['median']:.1f}" == m[5]
        assert row["ratio"] == row["sample_index_us"]["median"] / row["multinomial_us"]["median"]
        assert f"{row['ratio']:.3f}" == m[8]


def test_malformed_arguments_are_refused():
    for args in (("--vocab", "many"), ("--vocab", "0"), ("--rounds", "0"), ("--seconds", "0")):
        out = run_script(*args)
        assert out.returncode == 2 and "error:" in out.stderr, args
