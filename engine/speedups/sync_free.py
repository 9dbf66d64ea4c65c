"""sync_free(): a mode, like torch.no_grad, in which the speed paths read no device value on the host."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

_ACTIVE: ContextVar[bool] = ContextVar("sync_free", default=False)


@contextmanager
def sync_free():
    """Within: FastMoE runs its routed experts densely or gathered at any token count (never the sorted path,
    whose slices are sized by counts read back to the host) and the Sinkhorn runs in torch (no numpy round
    trip). A CUDA graph can capture only such code; engine.graphs enters this mode for its static bodies."""
    if torch.compiler.is_compiling():  # already sync-free (sync_free_active), and dynamo cannot trace a ContextVar
        yield
        return
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def sync_free_active() -> bool:
    """True within sync_free(), and while torch.compile traces (compiled code must not read values back either)."""
    return torch.compiler.is_compiling() or _ACTIVE.get()
