"""Two checkpoints on the same statistics, and the tables written for notebooks and read back."""
from __future__ import annotations

import pytest

from engine.spec.config import load_config
from engine.spec.errors import InputError
from engine.weights.compare import compare_rows, summary
from engine.weights.export import read_table, write_table
from engine.weights.reader import WeightReader
from engine.weights.views import run_views
from tests.official_helpers import DEFAULT, write_tiny_official
from tests.weights.folders import copy_of
from tests.weights.test_damaged import poke_float


def rows_of(folder, names=("router", "mhc", "attention_sink")):
    return [row for r in run_views(WeightReader(folder), list(names)).values() for row in r.rows]


def test_one_changed_value_is_the_one_difference(official, tmp_path):
    changed = copy_of(official, tmp_path / "changed")
    poke_float(changed, "layers.6.ffn.gate.bias", 0.25)
    rows = compare_rows(rows_of(official), rows_of(changed))
    differ = [r for r in rows if r["difference"]]
    assert [(r["tensor"], r["index"]) for r in differ] == [("layers.6.ffn.gate.bias", 0)]
    assert differ[0]["b"] == 0.25 and differ[0]["difference"] == 0.25 - differ[0]["a"]


@pytest.mark.slow  # initialises and quantizes a second model [2 s]
def test_two_training_states_differ_and_one_equals_itself(official, tmp_path):
    """The shipped model against the same architecture freshly initialised (its state before training)."""
    untrained = write_tiny_official(tmp_path / "init", load_config(DEFAULT / "config.json"), shards=2).folder
    trained = rows_of(official)
    rows = compare_rows(trained, rows_of(untrained))
    assert len(rows) == len(trained) and all(r["difference"] is not None for r in rows)
    by_stat = {(s["view"], s["stat"]): s for s in summary(rows)}
    assert by_stat[("router", "bias")]["differ"] > 0 and by_stat[("mhc", "comb")]["max_abs_difference"] > 0
    assert all(s["differ"] == 0 for s in summary(compare_rows(trained, trained)))


def test_a_statistic_only_one_side_has_is_kept(official):
    trained = rows_of(official, ("attention_sink",))
    rows = compare_rows(trained, trained[:-4])
    assert [r["b"] for r in rows[-4:]] == [None] * 4 and summary(rows)[0]["only_a"] == 4


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_export_round_trips(official, tmp_path, suffix):
    rows = rows_of(official)
    assert read_table(write_table(rows, tmp_path / f"stats{suffix}")) == rows
    compared = compare_rows(rows, rows[:-1])
    assert read_table(write_table(compared, tmp_path / f"compare{suffix}")) == compared


def test_export_refuses_an_unknown_suffix(tmp_path):
    with pytest.raises(InputError, match="parquet"):
        write_table([{"a": 1}], tmp_path / "x.xlsx")
