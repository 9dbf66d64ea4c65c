"""Running ranks for the parallel tests: as threads of this process in one gloo group (fast), or as processes
started by torchrun (the real launch); and comparing their outputs with one process's."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engine.parallel import World

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def run_ranks(n: int, work, timeout_s: float = 60.0) -> tuple[dict, dict]:
    """work(world) on n threads, each rank r of one gloo group: (results by rank, exceptions by rank)."""
    store = dist.HashStore()
    results, errors = {}, {}

    def rank_main(r: int) -> None:
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore("ranks", store), r, n, timedelta(seconds=timeout_s))
            results[r] = work(World(r, n, CPU, group, timeout_s))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[r] = e

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    assert not any(t.is_alive() for t in threads), "a rank thread hung past the group's timeout"
    return results, errors


def assert_close(want: dict, got: dict, tol: float, where: str) -> None:
    """Equal names, shapes and dtypes; floats within tol (trace columns, stored in float32 whatever the model's
    dtype, within 1e-6 at least), everything else exactly."""
    assert sorted(want) == sorted(got), where
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, f"{where}: {name} {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
        if w.dtype.is_floating_point and w.numel():
            limit = max(tol, 1e-6) if name.startswith("trace.") else tol
            diff = (g.double() - w.double()).abs().max().item()
            assert diff <= limit, f"{where}: {name} differs by {diff:.3g} (tolerance {limit:g})"
        else:
            assert torch.equal(g, w), f"{where}: {name} differs: {g.tolist()} vs {w.tolist()}"


def assert_same_on_every_rank(results: dict) -> None:
    for r in range(1, len(results)):
        for name, value in results[0].items():
            assert torch.equal(value, results[r][name]), f"rank {r}'s {name} differs from rank 0's"


def torchrun(n: int, argv: list[str], tmp_path: Path, timeout_s: float = 240, env: dict | None = None):
    """`torchrun --standalone --nproc-per-node n argv…`; returns (completed process, {rank: its stderr})."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "--log-dir", str(logs), "--redirects", "2", *argv]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                         env={**_env(), **(env or {})}, check=False)
    errs = {int(Path(p).parent.name): Path(p).read_text() for p in glob.glob(str(logs / "**" / "stderr.log"),
                                                                            recursive=True)}
    return run, errs


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
