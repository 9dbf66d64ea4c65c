"""One rank of an official-checkpoint parallel test, started by torchrun: load this rank's quantized shard and either
measure its memory (the load's resident growth and peak, then Engram rows read) or compute the teacher-forced
logits in --dtype; rank r writes rank{r}.json or rank{r}.safetensors into --out."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.checkpoint.official import ShardRows
from engine.checkpoint.official_load import plan_load
from engine.model import Transformer
from engine.parallel import build_shard, join_world, leave_world
from engine.quant.apply import quantize_model, resident_bytes
from engine.quant.host_engram import HostEngramTable
from engine.spec.config import load_config
from engine.spec.errors import EngineError
from tests.model_helpers import synthetic_token_map
from tests.official_helpers import memory_status, restart_peak
from tests.parallel_cases import teacher_forced_logits

MEMORY = ("VmRSS", "RssAnon", "RssFile")
PROBE_ROWS = 4096   # random rows per Engram table: a memory-mapped reader would keep ≥ 4 KiB resident for each


def measure(model_args, world, checkpoint: Path, token_map) -> dict:
    """The load's resident growth and peak and the shard's own bytes; then the growth while every host Engram
    table is read at PROBE_ROWS random rows (positioned reads: nothing stays resident but the rows returned), and
    the rows a prefill and a few decode steps ask the tables for."""
    warm = Transformer(model_args, token_map, device="meta")   # lazy imports and first-build caches, not measured
    plan_load(quantize_model(warm, from_values=False), model_args)
    del warm
    restart_peak()
    before = {key: memory_status(key) for key in MEMORY}
    started = time.perf_counter()
    model = build_shard(model_args, world, checkpoint=checkpoint, token_map=token_map)
    load_s = time.perf_counter() - started
    after = {key: memory_status(key) for key in MEMORY}
    peak = max(memory_status("VmHWM"), after["VmRSS"])
    tables = [m for m in model.modules() if isinstance(m, HostEngramTable)]
    g = torch.Generator().manual_seed(world.rank)
    with torch.inference_mode():
        for table in tables:   # warm-up: the code a first read runs (its libraries' pages), not measured
            table(torch.arange(16))
        probe_before = {key: memory_status(key) for key in MEMORY}
        for table in tables:
            table(torch.randint(0, table.n_rows, (PROBE_ROWS,), generator=g))   # [PROBE_ROWS, head_dim], dropped
        probe_after = {key: memory_status(key) for key in MEMORY}
        asked = []
        for table in tables:   # count the rows each table's source is asked for in a short generation
            rows = table.weight_source.rows
            table.weight_source.rows = lambda ids, rows=rows: (asked.append(ids.numel()), rows(ids))[1]
        cache = model.new_cache(1, 32)
        logits = model(torch.randint(0, model_args.vocab_size, (1, 16), generator=g), cache).logits   # [1, V]
        for _ in range(8):
            logits = model(logits.argmax(-1, keepdim=True), cache).logits
    sources = [s for t in tables for s in (t.weight_source, t.scale_source)]
    return {"before": before, "after": after, "peak": peak, "share": resident_bytes(model), "load_s": load_s,
            "probe_before": probe_before, "probe_after": probe_after, "probe_rows": PROBE_ROWS * len(tables),
            "rows_asked": sum(asked), "row_sources": sum(isinstance(s, ShardRows) for s in sources),
            **held_files(checkpoint)}


def held_files(folder: Path) -> dict[str, int]:
    """How the process holds the checkpoint's shards now: open file descriptors, and memory-mapped regions."""
    inside = str(folder.resolve()) + os.sep
    descriptors = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            descriptors.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:   # the descriptor listdir itself used, closed since
            pass
    with open("/proc/self/maps") as f:
        mapped = [line for line in f if inside in line]
    return {"open_files": sum(d.startswith(inside) for d in descriptors), "mapped_regions": len(mapped)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True, help="an official-format folder")
    p.add_argument("--out", required=True)
    p.add_argument("--measure", action="store_true", help="memory figures instead of the logits")
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    world = join_world("cpu")
    model_args = load_config(Path(a.checkpoint) / "config.json")
    token_map = synthetic_token_map(model_args)
    try:
        if a.measure:
            figures = measure(model_args, world, Path(a.checkpoint), token_map)
            (Path(a.out) / f"rank{world.rank}.json").write_text(json.dumps(figures))
        else:
            model = build_shard(model_args, world, checkpoint=a.checkpoint, token_map=token_map,
                                dtype=getattr(torch, a.dtype))
            save_file({"logits": teacher_forced_logits(model)}, str(Path(a.out) / f"rank{world.rank}.safetensors"))
    finally:
        leave_world()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
