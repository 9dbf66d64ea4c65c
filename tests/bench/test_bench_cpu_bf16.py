"""scripts/bench_cpu_bf16.py: one row per weight shape and row count, each of the four ways timed, fp32 the ×1.00
reference; malformed arguments refused with a message."""
from __future__ import annotations

import re

from tests.script_helpers import script_runner

CELL = r"\s+([\d.]+) \[\s*([\d.]+)–\s*([\d.]+)\] ×(\d+\.\d\d)"
ROW = re.compile(rf"^\s*(\d+)x(\d+)\s+(\d+){CELL * 4}  (resident fp32 copy|widened per call|bf16 kernel)$")

run_script = script_runner("bench_cpu_bf16.py")


def test_the_table_has_every_shape_and_row_count():
    out = run_script("--sizes", "8x16,32x32", "--rows", "1,3", "--rounds", "2", "--seconds", "0.002")
    assert out.returncode == 0, out.stderr
    assert "bf16 matrix instructions: " in out.stdout and "2 interleaved rounds" in out.stdout
    rows = [ROW.match(line) for line in out.stdout.splitlines()]
    got = [(int(m[1]), int(m[2]), int(m[3])) for m in rows if m]
    assert got == [(8, 16, 1), (8, 16, 3), (32, 32, 1), (32, 32, 3)]
    assert {m[20] for m in rows if m} == {"resident fp32 copy"}           # small products read the copy
    for m in filter(None, rows):
        cells = [tuple(float(v) for v in m.groups()[3 + 4 * i:7 + 4 * i]) for i in range(4)]
        assert cells[0][3] == 1.00                                   # fp32 against itself
        base = cells[0][0]
        for med, low, high, ratio in cells:
            assert 0 < low <= med <= high
            # the ratio of the unrounded medians, against those printed to 0.1 µs
            assert (med - 0.05) / (base + 0.05) - 0.005 <= ratio <= (med + 0.05) / (base - 0.05) + 0.005


def test_results_file_holds_every_way_of_every_product(tmp_path):
    from engine.bench.results_file import load
    path = tmp_path / "cpu_bf16.json"
    out = run_script("--sizes", "8x16", "--rows", "1,3", "--rounds", "2", "--seconds", "0.002", "--results", str(path))
    assert out.returncode == 0, out.stderr
    results = load(path)
    assert results["kind"] == "cpu_bf16" and [(r["weight"], r["rows"]) for r in results["rows"]] == [("8x16", 1),
                                                                                                    ("8x16", 3)]
    printed = [m for m in map(ROW.match, out.stdout.splitlines()) if m]
    for row, m in zip(results["rows"], printed):
        assert list(row["ways"]) == ["fp32", "bf16 kernel", "widened per call", "resident fp32 copy"]
        assert row["ways"]["fp32"]["ratio"] == 1.0 and row["engine"] == m[20]
        for i, way in enumerate(row["ways"].values()):
            assert way["min"] <= way["median"] <= way["max"] and f"{way['median']:.1f}" == m[4 + 4 * i]


def test_malformed_arguments_are_refused():
    for args in (("--rows", "one"), ("--sizes", "192"), ("--sizes", "0x4"), ("--rounds", "0")):
        out = run_script(*args)
        assert out.returncode == 2 and "error:" in out.stderr, args


def test_the_engine_column_names_the_way_linear_takes():
    from engine.speedups.cpu_bf16 import native_bf16_matmul
    out = run_script("--sizes", "1100x1000", "--rows", "1,2", "--rounds", "1", "--seconds", "0.002")
    assert out.returncode == 0, out.stderr
    ways = [m[20] for m in map(ROW.match, out.stdout.splitlines()) if m]
    # 1.1M elements: beyond RESIDENT_MAX_ELEMENTS, so no copy; two rows widen only without bf16 instructions
    assert ways == ["bf16 kernel", "bf16 kernel" if native_bf16_matmul() else "widened per call"]
