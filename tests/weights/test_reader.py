"""WeightReader: headers at once, tensors on demand, and a byte count that is exactly the tensors read."""
from __future__ import annotations

import math

import pytest
from safetensors import safe_open

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.header import ITEM_BYTES, read_safetensors_header
from engine.weights.reader import WeightReader
from engine.weights.views import VIEWS, run_view, run_views
from tests.official_helpers import DEFAULT
from tests.weights.folders import without_shard


def stored_bytes(folder, names) -> int:
    """The bytes of the named tensors, from the shards' own headers."""
    total = 0
    for shard in sorted(folder.glob("*.safetensors")):
        for name, e in read_safetensors_header(shard).entries.items():
            if name in names:
                total += math.prod(e.shape) * ITEM_BYTES[e.code]
    return total


def test_opening_reads_no_tensor_and_knows_the_checkpoint_size(official):
    r = WeightReader(official)
    assert r.bytes_read == 0 and r.reads == 0
    assert r.folder_bytes == r.total_bytes == stored_bytes(official, set(r.weight_map))


@pytest.mark.parametrize("view", list(VIEWS))
def test_the_bytes_read_are_the_bytes_of_the_tensors_read(official, view):
    """Whole-tensor views: the count equals the stored size of exactly the tensors they read (Engram's sampled rows
    are checked in test_views)."""
    r = WeightReader(official)
    result = run_view(r, view)
    assert result.bytes_read == r.bytes_read
    if view != "engram":
        assert r.bytes_read == stored_bytes(official, r.read_names)
    assert not result.problems and not result.absent


def test_no_view_reads_a_routed_expert_unless_asked(official):
    r = WeightReader(official)
    run_views(r)
    assert r.read_names and not [n for n in r.read_names if ".ffn.experts." in n]
    assert r.bytes_read < r.total_bytes / 5
    run_views(r, names=[], experts=True)
    assert any(".ffn.experts." in n for n in r.read_names)


def test_the_projects_own_layout_reads_the_same_learned_values(official):
    """checkpoints/default (this project's format) and its official conversion: the F32 tensors are equal."""
    own, converted = WeightReader(DEFAULT), WeightReader(official)
    for name in ("layers.3.ffn.gate.bias", "layers.5.hc_ffn_base", "mtp.1.attn.attn_sink"):
        assert own.tensor(name).equal(converted.tensor(name))
    with safe_open(str(DEFAULT / "model.safetensors"), framework="pt") as f:
        wq = f.get_tensor("layers.0.attn.wq_a.weight").float()
    # FP8 E4M3 with one power-of-two scale per block: a relative error of at most 2^-4 per value
    assert (converted.weight("layers.0.attn.wq_a.weight") - wq).abs().max() <= wq.abs().max() / 16


def test_a_missing_shard_is_reported_per_box_and_the_rest_reads(official, tmp_path):
    folder, gone = without_shard(official, tmp_path / "partial")
    r = WeightReader(folder)
    assert r.missing_shards == [gone]
    held = {n for n, s in r.weight_map.items() if s == gone}
    result = run_view(r, "attention_sink")
    lost = {n.removesuffix(".attn_sink") for n in held if n.endswith(".attn.attn_sink")}
    assert lost and set(result.absent) == lost
    assert all(gone in why for why in result.absent.values())
    assert {row["module"] for row in result.rows} == {n.removesuffix(".attn_sink") for n in r.entries
                                                      if n.endswith(".attn.attn_sink")}
    assert r.total_bytes == WeightReader(official).total_bytes > r.folder_bytes
    with pytest.raises(CheckpointError, match=gone):
        r.tensor(sorted(held)[0])


def test_not_a_checkpoint_folder_is_refused_by_name(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        WeightReader(tmp_path)
    (tmp_path / "config.json").write_text((DEFAULT / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights"):
        WeightReader(tmp_path)
