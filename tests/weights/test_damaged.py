"""A damaged checkpoint: a NaN is reported under the tensor's name and never becomes a statistic; a truncated shard
is named and its boxes say so, while every other box still reads."""
from __future__ import annotations

import json
import math
import struct

import pytest

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.header import read_safetensors_header
from engine.weights.reader import WeightReader
from engine.weights.views import run_view, run_views
from tests.weights.folders import copy_of


def poke_float(folder, name: str, value: float) -> str:
    """Overwrite the first F32 value of tensor `name` in its shard, in place; returns the shard's name."""
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][name]
    header = read_safetensors_header(folder / shard)
    entry = header.entries[name]
    assert entry.code == "F32"
    with open(folder / shard, "r+b") as f:
        f.seek(header.data_start + entry.begin)
        f.write(struct.pack("<f", value))
    return shard


def test_a_nan_is_named_and_left_out(official, tmp_path):
    folder = copy_of(official, tmp_path / "nan")
    poke_float(folder, "layers.3.attn.attn_sink", math.nan)
    result = run_view(WeightReader(folder), "attention_sink")
    assert list(result.problems) == ["layers.3.attn.attn_sink"]
    assert "NaN" in result.problems["layers.3.attn.attn_sink"]
    assert all(math.isfinite(r["value"]) for r in result.rows)
    assert {r["layer"] for r in result.rows} == set(range(11)) - {3}
    with pytest.raises(CheckpointError, match="layers.3.attn.attn_sink"):
        WeightReader(folder).tensor("layers.3.attn.attn_sink")


def test_a_truncated_shard_is_named_and_the_rest_reads(official, tmp_path):
    folder = copy_of(official, tmp_path / "cut")
    shard = folder / "model-00003-of-00004.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    r = WeightReader(folder)
    assert list(r.broken_shards) == [shard.name] and "truncated" in r.broken_shards[shard.name]
    results = run_views(r)
    absent = {m: why for res in results.values() for m, why in res.absent.items()}
    assert absent and all(str(shard) in why for why in absent.values())
    assert all(res.rows for name, res in results.items() if name != "hash_routing")
