"""After a collective failed: which rank is gone and which stopped answering, asked over a gloo group kept for this.

A failed all-reduce tells rank 0 only that some peer broke the step ("Connection closed by peer", or the process
group's timeout). To name the rank, rank 0 posts one receive per other rank on the health group (torch.distributed's
point-to-point ops and their Work.wait timeout): a rank whose process ended fails its receive at once, a frozen
rank lets it time out, and a rank that is still running (its own step failed too) answers with one send."""
from __future__ import annotations

import time
from contextlib import suppress
from datetime import timedelta

import torch

from .comm import backend_gist
from .world import World

MAX_WAIT_S = 10.0   # the longest rank 0 waits for the others' answers (at most the process group's timeout)


def silent_ranks(world: World, group, timeout_s: float) -> list[str]:
    """Rank 0: one sentence per other rank that gave no sign of life over `group` within timeout_s (capped at
    MAX_WAIT_S): 'rank 1 of 2 is gone (…)' for a process that ended, 'rank 1 of 2 did not answer within 3 s' for
    one that stopped responding. Empty when every rank answered."""
    wait_s = min(timeout_s, MAX_WAIT_S)
    deadline = time.monotonic() + wait_s
    signs = {r: torch.zeros(1) for r in range(1, world.size)}
    works, out = {}, []
    for r, sign in signs.items():   # every receive posted first: a rank that answers is heard whatever the order
        try:
            works[r] = group.recv([sign], r, 0)       # the group's ranks are the launch's: every rank is in it
        except RuntimeError as error:
            out.append(_silence(r, world.size, error, wait_s))
    for r, work in works.items():
        try:
            work.wait(timedelta(seconds=max(0.01, deadline - time.monotonic())))
        except RuntimeError as error:   # gloo: DistBackendError / DistNetworkError
            out.append(_silence(r, world.size, error, wait_s))
    return out


def _silence(rank: int, size: int, error: RuntimeError, wait_s: float) -> str:
    detail = backend_gist(error)
    if "timed out" in detail.lower():
        return f"rank {rank} of {size} did not answer within {wait_s:g} s (stopped responding)"
    return f"rank {rank} of {size} is gone: its process ended ({detail})"


def answer_rank_zero(group, timeout_s: float) -> None:
    """Every rank but 0, after its own step failed: the sign of life silent_ranks waits for. Waits at most
    timeout_s (capped at MAX_WAIT_S) for rank 0 to take it; nothing when rank 0 is gone."""
    with suppress(RuntimeError):
        group.send([torch.ones(1)], 0, 0).wait(timedelta(seconds=min(timeout_s, MAX_WAIT_S)))
