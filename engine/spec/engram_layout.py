"""Engram hash layout (spec §4.4.2): per-layer multipliers, table primes and row offsets (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

INT64_MAX = 2**63 - 1


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (bases are the first 13 primes)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in small:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class EngramLayout:
    """The hash tables of a config's Engram layers, from plain ints (ModelArgs.engram_layout builds one)."""
    layer_ids: tuple[int, ...]
    vocab_size: int                 # engram_vocab_size: every prime search starts above it
    max_ngram: int                  # engram_max_ngram_size
    n_heads: int                    # engram_n_heads
    compressed_vocab_size: int      # engram_compressed_vocab_size: bounds the multipliers

    def primes(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """primes[layer_index][n - 2][head]: the hash table size of each (layer, n-gram size, head)."""
        return _primes(self.layer_ids, self.vocab_size, self.max_ngram, self.n_heads)

    def table_sizes(self) -> list[list[int]]:
        """Per Engram layer, the (max_ngram-1)·heads table sizes in column order (n major, head minor)."""
        return [[p for per_n in layer for p in per_n] for layer in self.primes()]

    def offsets(self) -> list[list[int]]:
        """Per Engram layer, the first row of each column's table inside that layer's own embedding."""
        out = []
        for sizes in self.table_sizes():
            starts, total = [], 0
            for s in sizes:
                starts.append(total)
                total += s
            out.append(starts)
        return out

    def multipliers(self) -> list[list[int]]:
        """Per Engram layer, one odd multiplier per look-back 0..max_ngram-1, seeded by 10007·layer_id."""
        bound = (INT64_MAX // self.compressed_vocab_size) // 2
        out = []
        for layer in self.layer_ids:
            v = np.random.default_rng(10007 * layer).integers(0, bound, size=self.max_ngram, dtype=np.int64)
            out.append([int(2 * x + 1) for x in v])
        return out


@lru_cache(maxsize=32)
def _primes(layer_ids: tuple[int, ...], vocab_size: int, max_ngram: int, n_heads: int) -> tuple:
    used: set[int] = set()
    per_layer = []
    for _ in layer_ids:
        per_n = []
        for _n in range(2, max_ngram + 1):
            cur, heads = vocab_size - 1, []  # the search restarts for every (layer, n-gram size)
            for _h in range(n_heads):
                cur += 1
                while cur in used or not is_prime(cur):
                    cur += 1
                used.add(cur)
                heads.append(cur)
            per_n.append(tuple(heads))
        per_layer.append(tuple(per_n))
    return tuple(per_layer)
