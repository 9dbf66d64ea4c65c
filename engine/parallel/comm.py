"""The collectives the parallel layers use, each failing with a DistributedError that names the op and the module."""
from __future__ import annotations

import json
import re
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from .world import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, DistributedError


def all_reduce_sum(x: torch.Tensor, group, what: str) -> torch.Tensor:
    """Σ over the group's ranks of x (every rank gets the same sum), in place; returns x."""
    with _reported("all_reduce", group, what):
        dist.all_reduce(x, group=group)
    return x


def all_gather_cat(x: torch.Tensor, group, what: str) -> torch.Tensor:
    """Every rank's x [..., n] side by side in rank order → [..., ranks·n] on every rank."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(group.size())]
    with _reported("all_gather", group, what):
        dist.all_gather(parts, x, group=group)
    return torch.cat(parts, -1)


def broadcast_json(value: Any, group, what: str, device: torch.device | str = "cpu") -> Any:
    """Rank 0's value (anything JSON can carry: settings, a seed, a request) on every rank; the others' value is
    ignored. Sent as JSON bytes, never pickled; device: where the group's backend takes tensors (cuda for NCCL)."""
    data = json.dumps(value).encode() if group.rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    with _reported("broadcast", group, what):
        dist.broadcast(size, group_src=0, group=group)
        buf = torch.tensor(list(data), dtype=torch.uint8, device=device) if data else \
            torch.empty(int(size), dtype=torch.uint8, device=device)
        dist.broadcast(buf, group_src=0, group=group)
    return json.loads(bytes(buf.cpu().tolist()).decode())


def all_gather_text(text: str, group, what: str, device: torch.device | str = "cpu") -> list[str]:
    """Every rank's text (UTF-8, any length), in rank order, on every rank: the lengths first, then the bytes
    padded to the longest. Never pickled."""
    data = text.encode()
    sizes = all_gather_cat(torch.tensor([len(data)], dtype=torch.long, device=device), group, what).tolist()
    buf = torch.zeros(max(1, *sizes), dtype=torch.uint8, device=device)   # one byte at least: no empty collective
    buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    gathered = all_gather_cat(buf, group, what).view(len(sizes), -1).cpu()      # [ranks, longest]
    return [bytes(row[:n].tolist()).decode() for row, n in zip(gathered, sizes)]


@contextmanager
def _reported(op: str, group, what: str):
    """Turns the backend's error of one collective into a DistributedError naming rank, op, module and timeout."""
    try:
        yield
    except RuntimeError as error:  # gloo and NCCL raise RuntimeError subclasses (DistBackendError, …)
        detail = backend_gist(error)
        raise DistributedError(
            f"rank {group.rank()} of {group.size()}: {op} for {what} failed ({detail}). Another rank failed or "
            f"did not reach this step within the process group's timeout ({TIMEOUT_ENV}, default "
            f"{DEFAULT_TIMEOUT_S:g} s); see that rank's error") from None


def backend_gist(error: BaseException) -> str:
    """The backend's own words from one of its errors: the first line, without gloo's source location and its
    generic advice ('[…/pair.cc:553] Connection closed by peer [127.0.0.1]:3986. This is typically caused by…')."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line)
    return line.split(". This is typically")[0][:300]
