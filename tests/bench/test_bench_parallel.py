"""scripts/bench_parallel.py: one rank count's launches summed up in the printed table and in its results file, with
the communication lines computed from V4.1-Flash's config."""
from __future__ import annotations

import re

from engine.bench.results_file import load
from tests.script_helpers import script_runner

run_script = script_runner("bench_parallel.py")


def test_one_rank_is_its_own_reference_and_the_results_file_holds_the_table(tmp_path):
    path = tmp_path / "parallel.json"
    out = run_script("--config", "tiny-v4.1", "--ranks", "1", "--runs", "2", "--prompt-len", "2", "--new-tokens", "2",
                     "--repeats", "1", "--results", str(path))
    assert out.returncode == 0, out.stderr[-3000:]
    row = re.search(r"1 rank\s+median\s+([\d.]+)\s+range\s+([\d.]+) –\s+([\d.]+)\s+× 1\.00 of 1 rank", out.stdout)
    assert row, out.stdout
    results = load(path)
    assert results["kind"] == "parallel" and [r["ranks"] for r in results["rows"]] == [1]
    rates = results["rows"][0]["decode_tokens_per_s"]
    assert results["rows"][0]["ratio"] == 1.0 and f"{rates['median']:.1f}" == row[1]
    assert rates["min"] <= rates["median"] <= rates["max"] and results["settings"]["runs"] == 2
    assert any(line.startswith("  total: ") for line in results["notes"])   # the TP/EP 8 volume, from the config
