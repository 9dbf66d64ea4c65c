"""`python -m engine weights`: the statistics printed, exported, compared; a folder that is no checkpoint exits 2."""
from __future__ import annotations

from engine.cli import main
from engine.weights.export import read_table
from engine.weights.reader import WeightReader
from engine.weights.views import run_view
from tests.weights.folders import without_shard


def test_prints_exports_and_names_the_missing_shard(official, tmp_path, capsys):
    folder, gone = without_shard(official, tmp_path / "partial")
    out = tmp_path / "router.csv"
    assert main(["weights", str(folder), "--view", "router", "--view", "attention_sink", "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    assert gone in printed and "[router]" in printed and "[attention_sink]" in printed and "[mhc]" not in printed
    r = WeightReader(folder)
    assert read_table(out) == run_view(r, "router").rows + run_view(r, "attention_sink").rows
    assert f"read {r.bytes_read:,} B of {r.total_bytes:,} B" in printed


def test_compare_prints_where_two_folders_differ(official, tmp_path, capsys):
    assert main(["weights", str(official), "--view", "norms", "--compare", str(official)]) == 0
    assert "0 of" in capsys.readouterr().out


def test_a_folder_without_a_checkpoint_exits_2(tmp_path, capsys):
    assert main(["weights", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
