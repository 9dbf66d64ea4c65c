"""Buckets: one captured graph serves every live batch up to its size (padding rows fill the rest); one compiled
graph serves every run whose cache length falls in its bucket."""
from __future__ import annotations

from ..spec.errors import InputError


def bucket_for(n: int) -> int:
    """The smallest power of two ≥ n (1, 2, 4, 8, …): few graphs, at most 2× padded rows."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"a decode batch needs at least one row, got {n!r}")
    return 1 << (n - 1).bit_length()


def cache_length_for(needed: int, limit: int) -> int:
    """The cache length a compiled run allocates for `needed` positions: the smallest power of two ≥ needed (at
    least 64), but no more than `limit` (and never less than needed). A compiled body is specialised to its cache's
    shapes, so runs of nearby lengths then share one compiled graph instead of compiling again each; the price is
    attention over up to 2× masked cache rows."""
    if needed < 1:
        raise InputError(f"a cache needs at least one position, got {needed!r}")
    return max(needed, min(max(64, bucket_for(needed)), limit))
