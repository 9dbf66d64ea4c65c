"""The opt-in expert norms: the dequantized weights' norms, computed shard by shard with progress, then served from
the cache file until a shard changes; where the folder's parent is not writable the cache goes to the user's."""
from __future__ import annotations

import os

import torch

from engine.weights import expert_norms as en
from engine.weights.reader import WeightReader
from tests.weights.folders import copy_of, without_shard


def test_norms_are_the_dequantized_weights_norms_and_then_cached(official, tmp_path):
    folder = copy_of(official, tmp_path / "ckpt")
    r = WeightReader(folder)
    seen = []
    first = en.expert_norms(r, lambda done, total, shard: seen.append((done, total)))
    a = r.args
    assert len(first.rows) == 3 * (a.n_layers * a.n_routed_experts + a.n_draft_stages * a.draft_n_routed_experts)
    assert seen == [(i, len(seen)) for i in range(1, len(seen) + 1)] and len(seen) >= 2
    name = "layers.2.ffn.experts.5.w2.weight"
    got = next(row["value"] for row in first.rows if row["tensor"] == name)
    assert abs(got - float(WeightReader(folder).weight(name).norm())) < 1e-4
    assert first.bytes_read > 0 and not first.cached
    assert en.cache_path(folder) == tmp_path / "ckpt.v41viz-expert-norms.json"
    again = en.expert_norms(WeightReader(folder))
    assert again.cached and again.bytes_read == 0 and again.rows == first.rows
    shard = r.entries[name][0]                                          # a changed shard: only it is read again
    os.utime(folder / shard, ns=(1, 1))
    third = en.expert_norms(WeightReader(folder))
    assert 0 < third.bytes_read < first.bytes_read and third.rows == first.rows


def test_a_partial_folder_reports_the_missing_experts(official, tmp_path):
    folder, gone = without_shard(official, tmp_path / "partial", which=2)
    result = en.expert_norms(WeightReader(folder))
    assert result.absent and all(m.endswith(".ffn.experts") and gone in why for m, why in result.absent.items())
    r = WeightReader(folder)
    lost = {n for n, s in r.weight_map.items() if s == gone and en.EXPERT_WEIGHT.match(n)}
    assert lost and result.rows and not {row["tensor"] for row in result.rows} & lost
    assert {row["tensor"] for row in result.rows} == {n for n in r.entries if en.EXPERT_WEIGHT.match(n)}


def test_a_read_only_place_sends_the_cache_to_the_user_cache(official, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(en.os, "access", lambda path, mode: False)   # as if the folder's parent were read-only
    path = en.cache_path(official)
    assert path.parent == tmp_path / "cache" / "v41viz" and path.name.endswith(en.CACHE_SUFFIX)
    result = en.expert_norms(WeightReader(official))
    assert path.is_file() and result.rows


def test_a_damaged_cache_is_recomputed(official, tmp_path):
    cache = tmp_path / "norms.json"
    cache.write_text("{not json")
    result = en.expert_norms(WeightReader(official), cache=cache)
    assert result.rows and any("unreadable" in n for n in result.notes) and result.bytes_read > 0
    assert torch.isfinite(torch.tensor([r["value"] for r in result.rows])).all()
