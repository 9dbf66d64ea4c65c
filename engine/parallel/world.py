"""The process group of a torchrun launch: rank, world size, device and collective timeout of this process."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..spec.errors import EngineError, InputError

TIMEOUT_ENV = "ENGINE_DIST_TIMEOUT_S"
# How long a collective waits for the other ranks before this rank gives up with a DistributedError. Long enough
# for the slowest legitimate gap between two collectives (loading a rank's shard, a long prefill on a busy CPU).
DEFAULT_TIMEOUT_S = 300.0


class DistributedError(EngineError):
    """Another rank failed, stopped answering within the timeout, or the launcher ended this one."""


@dataclass(frozen=True)
class World:
    """This process's place in a torchrun launch. Every rank runs the same program on the same inputs; the
    model's heads, routed experts and vocabulary are split by `rank` (engine.parallel.shard), and the parallel
    modules communicate over `group` (the launch's default group; tests may pass a group of their own)."""
    rank: int
    size: int
    device: torch.device
    group: object
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_size() -> int:
    """The number of ranks torchrun started (WORLD_SIZE), 1 for an ordinary process."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(raw)
    except ValueError:
        raise InputError(f"WORLD_SIZE must be a whole number of processes, got {raw!r}") from None
    if size < 1:
        raise InputError(f"WORLD_SIZE must be at least 1, got {size}")
    return size


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def join_world(device: str | torch.device = "cpu") -> World | None:
    """None in a single-process run. Under torchrun (WORLD_SIZE > 1): this process's World, joining the process
    group on the first call (gloo for the CPU, NCCL for CUDA with one GPU per local rank). Idempotent."""
    size = launched_size()
    if size == 1:
        return None
    dev = torch.device(device)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"distributed runs use cpu (gloo) or cuda (NCCL), not {dev.type!r}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise InputError(f"local rank {local_rank} has no GPU: this host has {torch.cuda.device_count()}; "
                             "start at most one rank per GPU (torchrun --nproc-per-node)")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    limit = timeout_s()
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=limit))
        _end_on_terminate()
        _end_with_launcher()
    elif dist.get_backend() != backend:
        raise InputError(f"the process group runs {dist.get_backend()}, but device {device} needs {backend}")
    return World(dist.get_rank(), dist.get_world_size(), dev, dist.group.WORLD, limit)


def leave_world() -> None:
    """Destroy this process's process groups (every one: the world and any made with new_group), if any. A rank that
    exits with its groups alive leaves their backend's threads to the interpreter's teardown, which can abort the
    process (gloo: "terminate called without an active exception") after all its work is done."""
    if dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """True on rank 0 and in a single-process run: the process that prints and writes files."""
    return not dist.is_initialized() or dist.get_rank() == 0


@contextlib.contextmanager
def main_rank_output():
    """Within: stdout and stderr of every rank but 0 go nowhere, so a torchrun launch prints what one process
    would. Restored on exit, so an error leaving the block is still reported by each rank that raised it."""
    if launched_size() == 1 or os.environ.get("RANK", "0") == "0":
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _end_on_terminate() -> None:
    """torchrun ends the other ranks with SIGTERM when one fails: turn that into a DistributedError, so each of
    them reports why it stopped instead of vanishing (only possible in the main thread)."""
    def stop(signum, _frame):
        raise DistributedError(f"rank {dist.get_rank()}: stopped by the launcher (signal {signum}), because another "
                               "rank failed (see that rank's error)")

    with contextlib.suppress(ValueError):  # not the main thread: keep the default handler
        signal.signal(signal.SIGTERM, stop)


def _end_with_launcher() -> None:
    """A rank whose launcher died without ending it (torchrun killed with SIGKILL) would wait in its next collective
    until the timeout, or forever for a service's next request: a watcher thread ends it once it is orphaned."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(2.0)
        print(f"error: rank {dist.get_rank()}: the launcher (pid {launcher}) is gone; ending this rank",
              file=sys.stderr, flush=True)
        os._exit(3)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
