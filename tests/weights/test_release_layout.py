"""The release's own layout without its data: DeepSeek-V4.1-Flash's config and a 48-shard index of all its tensors,
no shard downloaded. The reader sizes the whole checkpoint from the index alone, and every view says, box by box,
which shard it waits for, reading nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.accounting.accounting import account
from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.official_layout import INDEX_NAME, shard_name
from engine.spec.config import load_config
from engine.weights.expert_norms import expert_norms
from engine.weights.reader import WeightReader
from engine.weights.views import VIEWS, run_views

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow   # the inventory of 95,819 tensors and an 8 MB index [~4 s]
def test_the_release_without_shards_reads_nothing_and_names_each_missing_shard(tmp_path):
    config = ROOT / "configs" / "deepseek-v4.1-flash.json"
    args = load_config(config)
    names = [s.name for s in inventory_tuple(args)]
    per = -(-len(names) // 48)
    weight_map = {n: shard_name(i // per, 48) for i, n in enumerate(names)}
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(config.read_text())
    r = WeightReader(tmp_path)
    assert len(r.missing_shards) == 48 and r.folder_bytes == 0
    assert r.total_bytes == account(args).checkpoint_bytes
    results = run_views(r, ["router", "mhc", "attention_sink", "engram", "dspark"])
    assert r.bytes_read == 0 and all(res.absent and not res.rows for res in results.values())
    assert len(results["router"].absent) == args.n_layers + args.n_draft_stages
    assert all("is not in the folder" in why for why in results["mhc"].absent.values())
    experts = expert_norms(r, cache=tmp_path / "norms.json")
    assert not experts.rows and len(experts.absent) == args.n_layers + args.n_draft_stages


@pytest.mark.slow
@pytest.mark.full_width   # the 6.2 GiB rehearsal folder (written once, ~16 min on 2 cores; then reused)
def test_the_full_width_rehearsal_views_read_a_sliver_of_it():
    from tests.official_helpers import rehearsal_folder
    r = WeightReader(rehearsal_folder())
    results = run_views(r, [name for name in VIEWS if name != "dspark"])
    assert r.bytes_read < r.total_bytes / 500       # small tensors, Engram row samples: megabytes of 6.2 GiB
    before, names_before = r.bytes_read, set(r.read_names)
    results.update(run_views(r, ["dspark"]))        # the drafter's own matrices: main_proj, the Markov head
    dspark_names = r.read_names - names_before
    assert dspark_names and all(n.startswith("mtp.") for n in dspark_names)
    assert r.bytes_read - before <= sum(r.nbytes(n) for n in dspark_names)   # each read at most once, whole
    assert all(not res.absent and not res.problems for res in results.values())
    assert all(res.rows for name, res in results.items() if name != "hash_routing")
    assert not [n for n in r.read_names if ".ffn.experts." in n]
