"""Steps per second of the target's verify forward by batch tokens: profiled once per machine, stored as JSON."""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from ..spec.errors import InputError
from .schedule import ThroughputTable

CACHE_DIR = Path(".cache")


def device_label(device: str | torch.device) -> str:
    """A file-name-safe name of the hardware: the GPU's name, or the CPU architecture and core count."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(dev)
    else:
        name = f"{platform.machine()}-{os.cpu_count()}cores"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower()


def table_path(model, cache_dir: Path | str = CACHE_DIR) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", model.args.name or "model")
    return Path(cache_dir) / f"sps-{device_label(model.device)}-{name}.json"


@torch.inference_mode()
def profile_throughput(model, *, max_batch: int | None = None, context: int = 16, repeats: int = 3,
                       on_progress: Callable[[int, int], None] | None = None) -> ThroughputTable:
    """Time verify-shaped target forwards: R rows × s tokens (s = 1 .. γ+1, R = 1, 2, 4 .. max_batch) after a
    `context`-token prefill, and keep the median steps/s per batch-token count R·s (the fastest shape when
    several give the same count). Rolled back after each call, so every forward sees the same cache.
    on_progress(done, total) is called after each shape (a caller shows progress; raising there stops)."""
    a = model.args
    gamma = a.dspark_block_size
    max_batch = max_batch or a.max_batch_size
    if max_batch < 1 or context < 1 or repeats < 1:
        raise InputError("profile_throughput needs max_batch, context and repeats >= 1")
    batches = sorted({min(2 ** k, max_batch) for k in range(max_batch.bit_length() + 1)})
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(max_batch, context + gamma + 2)
    model(torch.randint(3, a.vocab_size, (max_batch, context), generator=g).to(model.device), cache)
    best: dict[int, float] = {}
    shapes, done = len(batches) * (gamma + 1), 0
    if on_progress is not None:
        on_progress(0, shapes)
    for rows in batches:
        for s in range(1, gamma + 2):
            tokens = torch.randint(3, a.vocab_size, (rows, s), generator=g).to(model.device)
            times = []
            for _ in range(repeats + 1):  # the first call warms up
                t0 = time.perf_counter()
                model(tokens, cache, rows=torch.arange(rows), logits="all")
                if model.device.type == "cuda":
                    torch.cuda.synchronize(model.device)
                times.append(time.perf_counter() - t0)
                cache.rollback(context, torch.arange(rows))
            sps = 1.0 / statistics.median(times[1:])
            best[rows * s] = max(best.get(rows * s, 0.0), sps)
            done += 1
            if on_progress is not None:
                on_progress(done, shapes)
    xs = sorted(best)
    return ThroughputTable(xs, [best[x] for x in xs], device=device_label(model.device),
                           meta={"config": a.name, "threads": torch.get_num_threads(), "dtype": str(model.dtype),
                                 "context": context, "repeats": repeats, "max_batch": max_batch})


def save_table(table: ThroughputTable, path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch_tokens": table.batch_tokens, "steps_per_second": table.steps_per_second,
                                "device": table.device, "meta": table.meta}, indent=1))


def load_table(path: Path | str) -> ThroughputTable:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
        return ThroughputTable([int(x) for x in d["batch_tokens"]], [float(x) for x in d["steps_per_second"]],
                               device=str(d.get("device", "")), meta=dict(d.get("meta", {})))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise InputError(f"{path} is not a throughput table ({e}); delete it to profile again") from e


def load_or_profile(model, cache_dir: Path | str = CACHE_DIR, **kw) -> ThroughputTable:
    """The stored table for this model on this machine, profiled and stored on first use. A table made with
    another thread count or dtype is profiled again (those change the curve)."""
    path = table_path(model, cache_dir)
    if path.exists():
        table = load_table(path)
        if table.meta.get("threads") == torch.get_num_threads() and table.meta.get("dtype") == str(model.dtype):
            return table
    table = profile_throughput(model, **kw)
    save_table(table, path)
    return table
