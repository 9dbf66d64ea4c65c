"""decode_body, draft_body and the drafter rings' rows through torch.compile (inductor), each made once per process
and shared."""
from __future__ import annotations

import warnings
from functools import lru_cache

import torch

from ..dspark.drafter_cache import tapped_ring_rows
from .decode_body import decode_body
from .draft_body import draft_body

RECOMPILE_LIMIT = 64


@lru_cache(maxsize=1)
def compiled_body():
    """decode_body compiled with static shapes (a static body's widths never depend on a value). Dynamo guards
    its compiled graphs on the shapes of what the body is called with, so one wrapper serves every decoder.
    The indexer's RoPE factors stay complex tensors (the reference's cis), for which inductor calls the eager
    kernels and says so once; that notice is silenced (_prepare_dynamo), as it is expected."""
    _prepare_dynamo()
    return torch.compile(decode_body, dynamic=False)


@lru_cache(maxsize=1)
def compiled_draft_body():
    """draft_body compiled with static shapes, as compiled_body (one wrapper, graphs guarded on shapes and on the
    greedy flag)."""
    _prepare_dynamo()
    return torch.compile(draft_body, dynamic=False)


@lru_cache(maxsize=1)
def compiled_ring_rows():
    """tapped_ring_rows compiled with static shapes: a verify block's taps into the drafter rings' rows (the
    DrafterCache's block_rows)."""
    _prepare_dynamo()
    return torch.compile(tapped_ring_rows, dynamic=False)


def _prepare_dynamo() -> None:
    """Silences inductor's notice about the complex RoPE factors, and lets dynamo keep more compiled graphs per body
    than its default 8 (past the limit it would run the body eagerly, slowly): a body gets one per batch bucket,
    cache length bucket (engine.graphs.buckets.cache_length_for) and block width."""
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
