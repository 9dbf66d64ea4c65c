"""`engine bench --results`: the bench's figures in a results file, with the command that measured them; the
recorder writes nothing without a path."""
from __future__ import annotations

import json

from engine.bench.results_file import FORMAT, ResultsRecorder, load
from engine.cli import main


def test_engine_bench_writes_its_figures_as_a_results_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "bench.json"
    argv = ["bench", "--config", "tiny-v4.1", "--threads", "1", "--prompt-len", "4", "--new-tokens", "3",
            "--repeats", "1", "--json", "--results", str(path)]
    monkeypatch.setattr("sys.argv", ["engine", *argv])
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    results = load(path)
    assert results["format"] == FORMAT and results["kind"] == "engine_bench" and results["rows"] == [printed]
    assert results["command"] == "python -m engine " + " ".join(argv) and results["threads"] == 1
    assert results["load_average"]["before"] and results["load_average"]["after"]


def test_without_a_path_nothing_is_written(tmp_path):
    recorder = ResultsRecorder(None, "sampling", "scripts/bench_sampling.py", [])
    assert recorder.write([{"x": 1.0}], 1) is None and not list(tmp_path.iterdir())


def test_a_malformed_row_is_refused_before_anything_is_written(tmp_path):
    recorder = ResultsRecorder(tmp_path / "r.json", "sampling", "scripts/bench_sampling.py", ["--a b"])
    assert recorder.command == "python scripts/bench_sampling.py '--a b'"
    try:
        recorder.write([{"x": float("inf")}], 1)
    except ValueError as e:
        assert "rows[0].x is not finite" in str(e)
    else:
        raise AssertionError("an infinite number was written")
    assert not (tmp_path / "r.json").exists()
