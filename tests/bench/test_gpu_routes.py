"""scripts/gpu_routes.py, the timing of the official-format routes that scripts/gpu_check.sh runs on a GPU, run here on
the CPU: the whole model and the routed experts in host memory give the same greedy text, and each launch writes a
well-formed results file with its load time, tokens/s and peak memory."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.results_file import check, load
from tests.script_helpers import script_module

# two loads of the shipped model quantized, and 2 × 3 short generations [12 s]
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def gpu_routes():
    return script_module("gpu_routes.py")


def test_the_plain_and_host_expert_routes_write_the_same_text(tmp_path):
    official = tmp_path / "official"
    subprocess.run([sys.executable, "-m", "engine", "quantize", "--checkpoint", str(ROOT / "checkpoints" / "default"),
                    "--out", str(official), "--shards", "2"], cwd=ROOT, check=True, capture_output=True)
    rows = {}
    for route in ("plain", "host-experts"):
        out = tmp_path / f"{route}.json"
        assert gpu_routes().main(["--checkpoint", str(official), "--route", route, "--device", "cpu",
                                  "--new-tokens", "8", "--repeats", "2", "--results", str(out)]) == 0
        results = load(out)
        assert check(results) == [], route
        (row,) = results["rows"]
        assert row["route"] == route and row["ranks"] == 1 and row["distinct_texts"] == 1
        assert row["load_s"] > 0 and row["decode_tokens_per_s"]["median"] > 0
        assert row["host_peak_bytes"][0] > 0 and row["gpu_peak_bytes"] == [0]
        rows[route] = row
    assert rows["plain"]["text_sha256"] == rows["host-experts"]["text_sha256"]
