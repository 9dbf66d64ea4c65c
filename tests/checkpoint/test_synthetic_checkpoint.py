"""`engine quantize --synthetic`: seeded random weights written straight into the official layout, every tensor as
the inventory says, loadable, generating finite logits; the same seed gives the same bytes; and the writer's peak
memory is a few blocks of rows, not the checkpoint (measured in a fresh process)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.official import TORCH_DTYPES
from engine.checkpoint.official_layout import INDEX_NAME, official_args
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.synthetic import reuse_or_write, write_synthetic
from engine.cli import main
from engine.spec.config import load_config
from engine.text.vocab import ID_MAP_NAME
from tests.official_helpers import DEFAULT

ROOT = Path(__file__).resolve().parents[2]
MIB = 2 ** 20


def small_args():
    """The default checkpoint's architecture (vocabulary 1,000-odd ids) in the official layout."""
    return official_args(load_config(DEFAULT / "config.json"))


def test_every_tensor_is_written_as_the_inventory_says(tmp_path):
    args = small_args()
    written = write_synthetic(args, tmp_path / "a", seed=3, shards=2)
    index = json.loads((tmp_path / "a" / INDEX_NAME).read_text())["weight_map"]
    inventory = inventory_tuple(args)
    assert set(index) == {spec.name for spec in inventory} and len(written.shards) == 2
    for spec in inventory:
        with safe_open(str(tmp_path / "a" / index[spec.name]), framework="pt") as f:
            got = f.get_tensor(spec.name)
        assert got.dtype == TORCH_DTYPES[spec.dtype] and tuple(got.shape) == spec.shape, spec.name
        if spec.name == "embed.weight":
            first_embed = got
        if spec.is_scale:   # E8M0 codes of init-scale values: far from the NaN code 255 and from 0
            assert 100 < int(got.view(torch.uint8).min()) and int(got.view(torch.uint8).max()) < 140, spec.name
    # the same seed gives the same bytes; another seed other bytes
    first = {s.name: s.read_bytes() for s in written.shards}
    write_synthetic(args, tmp_path / "b", seed=3, shards=2)
    assert all((tmp_path / "b" / name).read_bytes() == data for name, data in first.items())
    # reuse_or_write: the same config and seed reused, another seed rewritten in place, a foreign folder refused
    assert reuse_or_write(args, tmp_path / "a", seed=3) == (tmp_path / "a", False)
    assert reuse_or_write(args, tmp_path / "a", seed=4) == (tmp_path / "a", True)
    index = json.loads((tmp_path / "a" / INDEX_NAME).read_text())["weight_map"]
    assert index.keys() == {spec.name for spec in inventory}
    assert sorted(p.name for p in (tmp_path / "a").glob("*.safetensors")) == sorted(set(index.values()))
    with safe_open(str(tmp_path / "a" / index["embed.weight"]), framework="pt") as f:
        assert not torch.equal(f.get_tensor("embed.weight"), first_embed)
    write_official(DEFAULT, tmp_path / "foreign", shards=1)
    with pytest.raises(CheckpointError, match="engine quantize --synthetic did not write"):
        reuse_or_write(load_config(tmp_path / "foreign" / "config.json"), tmp_path / "foreign")


@pytest.mark.slow  # loads the written checkpoint and generates [62 s at nice 19 beside a full-width run]
def test_the_cli_writes_a_checkpoint_that_loads_and_generates(tmp_path, capsys):
    config = tmp_path / "small.json"
    config.write_text((DEFAULT / "config.json").read_text())
    assert main(["quantize", "--synthetic", str(config), "--out", str(tmp_path / "out"), "--seed", "1"]) == 0
    assert "synthetic, seed 1" in capsys.readouterr().err
    shutil.copyfile(DEFAULT / ID_MAP_NAME, tmp_path / "out" / ID_MAP_NAME)   # the config's reduced vocabulary
    from engine.generation import Engine
    from engine.request import GenerationRequest
    engine = Engine.load(checkpoint=tmp_path / "out")
    finite = []
    engine.model.register_forward_hook(lambda m, i, out: finite.append(bool(torch.isfinite(out.logits).all())))
    result = engine.generate([[0, 5, 6, 7]], GenerationRequest.of(4, stop_tokens=()))
    assert len(result.tokens[0]) == 4 and finite and all(finite)


def test_the_cli_refuses_both_sources_and_a_bad_seed(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["quantize", "--synthetic", "tiny-v4.1", "--checkpoint", str(DEFAULT), "--out", str(tmp_path / "x")])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["quantize", "--synthetic", "tiny-v4.1", "--out", str(tmp_path / "y"), "--seed", "-1"]) != 0
    assert "--seed must lie in" in capsys.readouterr().err


MEASURE = """
import json, sys
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.synthetic import reuse_or_write, write_synthetic
from engine.spec.config import load_config
from engine.text.vocab import ID_MAP_NAME
from tests.official_helpers import memory_status, restart_peak
args = load_config(sys.argv[1])
write_synthetic(args.replace(moe_inter_dim=96), sys.argv[2] + "-warm", shards=1)   # imports and caches first
restart_peak()
before = memory_status("VmRSS")
written = write_synthetic(args, sys.argv[2], shards=2, block_values=int(sys.argv[3]))
print(json.dumps({"before": before, "peak": max(memory_status("VmHWM"), memory_status("VmRSS")),
                  "total": written.total_bytes}))
"""


@pytest.mark.slow  # writes a 200 MiB checkpoint in a fresh process, peak RSS measured [570 s at nice 19 beside a run]
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS / VmHWM from /proc")
def test_the_writer_holds_a_few_blocks_not_the_checkpoint(tmp_path):
    """A checkpoint of ~200 MiB written with blocks of 1 Mi values (4 MiB in fp32): the writer's resident set grows
    by a small multiple of one block, whatever the checkpoint's size (the full-width rehearsal's 6.2 GiB, whose
    largest tensor is 1.2 GiB, was written with a peak RSS of 677 MiB, the interpreter and torch included)."""
    config = tmp_path / "wide.json"
    args = small_args().replace(moe_inter_dim=4096)
    config.write_text(json.dumps({k: v for k, v in args.to_dict().items() if k != "name"}))
    block = 1 << 20
    run = subprocess.run([sys.executable, "-c", MEASURE, str(config), str(tmp_path / "out"), str(block)],
                         capture_output=True, text=True, cwd=ROOT, check=False, timeout=600)
    assert run.returncode == 0, run.stderr
    m = json.loads(run.stdout)
    grew = m["peak"] - m["before"]
    print(f"\nwrote {m['total'] / MIB:.0f} MiB with blocks of {block:,} values: peak RSS {grew / MIB:.1f} MiB above "
          f"the start")
    assert m["total"] > 150 * MIB
    assert grew < 12 * 4 * block + 32 * MIB < m["total"] / 2
