"""Steps per second of the target's verify forward by batch tokens, and the drafter's cost by batch rows: profiled
once per machine, model and engine code, stored as JSON in the user's cache folder (user_cache_dir), so that a
restart, another checkout or another working directory finds it again."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from ..request.sampling import SamplingParams
from ..spec.errors import InputError
from .drafter import draft
from .drafter_cache import DrafterCache
from .schedule import ThroughputTable, interpolate


def user_cache_dir() -> Path:
    """Where the tables live: $V41VIZ_CACHE_DIR, else $XDG_CACHE_HOME/v41viz, else ~/.cache/v41viz (one per user and
    machine; each file says which hardware, torch, config and engine code it was timed for: table_key)."""
    if folder := os.environ.get("V41VIZ_CACHE_DIR"):
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "v41viz"


CACHE_DIR = user_cache_dir()
# the engine code a step's speed depends on: a change in any of these files makes a stored table stale
TIMED_CODE = ("model", "speedups", "dspark", "generation", "quant", "kernels")
ENGINE = Path(__file__).resolve().parents[1]


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


def code_digest() -> str:
    """sha256 (16 hex digits) of the engine sources (Python and C++) in TIMED_CODE."""
    h = hashlib.sha256()
    for path in sorted(p for d in TIMED_CODE for ext in ("*.py", "*.cpp") for p in (ENGINE / d).rglob(ext)):
        h.update(str(path.relative_to(ENGINE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string: two machines with the same core
    count but other CPUs time differently."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def table_key(model) -> dict:
    """What a stored table is valid for: the hardware (device, CPU model), torch and its thread count, the model's
    config, dtype and options, and the engine code (code_digest). Weights do not enter: they do not change a step's
    cost."""
    config = json.dumps(asdict(model.args), sort_keys=True, default=str)
    return {"device": device_label(model.device), "cpu": cpu_model(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "dtype": str(model.dtype), "options": repr(model.options), "code": code_digest(),
            "config": hashlib.sha256(config.encode()).hexdigest()[:16]}


def monotone_decreasing(values: list[float]) -> list[float]:
    """The closest non-increasing sequence in least squares (pool adjacent violators): more batch tokens never
    make a step faster, so a measured rise is noise, averaged with its neighbours instead of kept."""
    blocks: list[list[float]] = []                 # [mean, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]


def convex_minorant(xs: list[int], ys: list[float]) -> list[float]:
    """The greatest convex function below the points (x, y), at each x (the lower hull, interpolated). A step's
    time is convex in its tokens once the per-call overhead is paid; a measured bump above the hull is noise, and
    it would stop DSpark Alg. 1's early-stopped search at a local optimum: with expected tokens concave in the
    verified drafts (survival never rises) and time convex, expected tokens per second has one peak."""
    hull: list[tuple[float, float]] = []
    for p in zip(xs, ys):
        while len(hull) > 1 and ((hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])
                                 >= (p[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0])):
            hull.pop()                             # the last vertex lies on or above the chord: not on the hull
        hull.append(p)
    hx, hy = [x for x, _ in hull], [y for _, y in hull]
    return [interpolate(hx, hy, x) for x in xs]


def table_points(seconds: dict[tuple[int, int], float]) -> tuple[list[int], list[float]]:
    """Median seconds per (rows, tokens per row) shape → (batch tokens, steps/s). Up to one row's longest block the
    one-row times, made non-decreasing (monotone_decreasing on their rates) and, from two tokens on, convex
    (convex_minorant): a request alone, the common case, is scheduled from its own curve, which has one peak once
    a drafting step verifies at least one draft (the jump from one token to a multi-token call, larger than the
    steps after it, is then always paid; PlainFallback); beyond, the fastest shape of each batch-token count,
    never faster than a smaller count."""
    one_row = sorted(s for rows, s in seconds if rows == 1)
    rates = monotone_decreasing([1.0 / seconds[1, s] for s in one_row])
    times = [1.0 / rates[0]] + convex_minorant(one_row[1:], [1.0 / r for r in rates[1:]])
    more: dict[int, float] = {}
    for (rows, s), t in seconds.items():
        if rows * s > one_row[-1]:
            more[rows * s] = min(more.get(rows * s, t), t)
    xs = list(one_row)
    for count in sorted(more):
        xs.append(count)
        times.append(max(more[count], times[-1]))
    return xs, [1.0 / t for t in times]


def cpu_clock(model) -> Callable[[], float]:
    """The clock a profile reads: on the CPU with one thread, the process's CPU time, which other work on a busy
    machine does not stretch (it delays both sides of every comparison alike, so the table keeps their ratios
    either way, but wall time turns its swings into noise); with more threads, or on a GPU, wall time."""
    if model.device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


@torch.inference_mode()
def profile_throughput(model, *, max_batch: int | None = None, context: int = 40, repeats: int = 9,
                       on_progress: Callable[[int, int], None] | None = None) -> ThroughputTable:
    """Time verify-shaped target forwards, R rows × s tokens (s = 1 .. γ+1, R = 1, 2, 4 .. max_batch) after a
    `context`-token prefill (the middle of a short generation: compressed groups written, the indexer not yet
    past its top-k, so that plain and verify steps take the same paths), and draft steps of R rows (the draft,
    and the rings taking a γ+1 block's taps), each multi-token forward right after a draft step as in a drafting
    step. `repeats` rounds visit every shape once each (interleaved, so that a change of machine load spreads
    over all shapes instead of biasing some), after a warm-up round; each shape and the draft keep their medians
    (table_points turns the shapes' into steps/s by batch tokens). Times are read on cpu_clock. Rolled
    back after each call, so every forward sees the same cache. on_progress(done, total) is called after each
    verify shape timed, warm-up included (raising stops)."""
    a = model.args
    gamma = a.dspark_block_size
    max_batch = max_batch or a.max_batch_size
    if max_batch < 1 or context < 1 or repeats < 1:
        raise InputError("profile_throughput needs max_batch, context and repeats >= 1")
    batches = sorted({min(2 ** k, max_batch) for k in range(max_batch.bit_length() + 1)})
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(max_batch, context + gamma + 2)
    rings = DrafterCache(model, max_batch, cache.margin)
    every = torch.arange(max_batch)
    _, taps = model(torch.randint(3, a.vocab_size, (max_batch, context), generator=g).to(model.device), cache)
    rings.append(model, taps, every)
    shapes = [(rows, s) for rows in batches for s in range(1, gamma + 2)]
    tokens = {sh: torch.randint(3, a.vocab_size, sh, generator=g).to(model.device) for sh in shapes}
    anchors = torch.randint(3, a.vocab_size, (max_batch,), generator=g)
    block = torch.randn(max_batch, gamma + 1, taps.size(-1), generator=g).to(taps)   # a verified block's taps
    forward_s: dict[tuple[int, int], list[float]] = {sh: [] for sh in shapes}
    draft_s: dict[int, list[float]] = {rows: [] for rows in batches}

    clock = cpu_clock(model)

    def timed(fn) -> float:
        t0 = clock()
        fn()
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        return clock() - t0

    def draft_step(rows: int) -> None:
        draft(model, rings, torch.arange(rows), anchors[:rows], SamplingParams(), [None] * rows)
        rings.append(model, block[:rows], torch.arange(rows))

    total, done = (repeats + 1) * len(shapes), 0

    def progress() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    if on_progress is not None:
        on_progress(0, total)
    for round_ in range(repeats + 1):  # round 0 warms up
        for rows in batches:
            for s in range(1, gamma + 2):
                if s > 1:  # a verify block follows its draft, as in a drafting step (the two share weights)
                    dt = timed(lambda: draft_step(rows))
                    rings.rollback(context, torch.arange(rows))
                    if round_:
                        draft_s[rows].append(dt)
                dt = timed(lambda: model(tokens[rows, s], cache, rows=torch.arange(rows), logits="all"))
                cache.rollback(context, torch.arange(rows))
                if round_:
                    forward_s[rows, s].append(dt)
                progress()
    xs, sps = table_points({shape: statistics.median(times) for shape, times in forward_s.items()})
    return ThroughputTable(xs, sps, device=device_label(model.device),
                           meta={"config": a.name, "context": context, "repeats": repeats, "max_batch": max_batch,
                                 "key": table_key(model)},
                           draft_rows=batches, draft_seconds=[statistics.median(draft_s[r]) for r in batches])


def save_table(table: ThroughputTable, path: Path | str) -> None:
    """Written to a temporary file and renamed, so that a reader (another server on this machine) never sees half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(json.dumps({"batch_tokens": table.batch_tokens, "steps_per_second": table.steps_per_second,
                                "draft_rows": table.draft_rows, "draft_seconds": table.draft_seconds,
                                "device": table.device, "meta": table.meta}, indent=1))
    part.replace(path)


def load_table(path: Path | str) -> ThroughputTable:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
        return ThroughputTable([int(x) for x in d["batch_tokens"]], [float(x) for x in d["steps_per_second"]],
                               device=str(d.get("device", "")), meta=dict(d.get("meta", {})),
                               draft_rows=[int(x) for x in d.get("draft_rows", [])],
                               draft_seconds=[float(x) for x in d.get("draft_seconds", [])])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise InputError(f"{path} is not a throughput table ({e}); delete it to profile again") from e


def stored_table(model, cache_dir: Path | str = CACHE_DIR) -> ThroughputTable | None:
    """The stored table for this model on this machine if it is current: made for this key (table_key: the same
    hardware, threads, dtype, options, config and engine code); else None."""
    path = table_path(model, cache_dir)
    if path.exists():
        table = load_table(path)
        if table.meta.get("key") == table_key(model):
            return table
    return None


def profile_and_store(model, cache_dir: Path | str = CACHE_DIR, **kw) -> ThroughputTable:
    """profile_throughput(model, **kw), stored where stored_table finds it."""
    table = profile_throughput(model, **kw)
    save_table(table, table_path(model, cache_dir))
    return table


def load_or_profile(model, cache_dir: Path | str = CACHE_DIR, **kw) -> ThroughputTable:
    """The stored table for this model on this machine (stored_table), profiled and stored when there is none
    or it is stale."""
    table = stored_table(model, cache_dir)
    return table if table is not None else profile_and_store(model, cache_dir, **kw)
