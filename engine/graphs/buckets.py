"""Batch-size buckets: one captured graph serves every live batch up to its size (padding rows fill the rest)."""
from __future__ import annotations

from ..spec.errors import InputError


def bucket_for(n: int) -> int:
    """The smallest power of two ≥ n (1, 2, 4, 8, …): few graphs, at most 2× padded rows."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"a decode batch needs at least one row, got {n!r}")
    return 1 << (n - 1).bit_length()
