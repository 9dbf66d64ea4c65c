"""Engram n-gram hashing (spec §4.4.3), vectorized over batch, positions and all Engram layers (numpy, torch-free)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..spec.errors import InputError

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

DEAD = -1  # history value of a masked position (image tokens): it blocks every look-back through it


def as_batch(ids, name: str = "ids") -> np.ndarray:
    """int64 [B, S] from a [B, S] array/nested list or a flat [S] list (then B = 1)."""
    arr = np.asarray(ids)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise InputError(f"{name} must be [batch, seq] or [seq], got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_):
        raise InputError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class NgramHash:
    """The hash of §4.4.3 for all Engram layers: each position's look-back n-grams of compressed ids → row
    ids into the layers' embedding tables. Stateless; the one implementation (the model calls it too)."""

    def __init__(self, args: "ModelArgs"):
        self.max_ngram = args.engram_max_ngram_size
        self.n_heads = args.engram_n_heads
        self.multipliers = np.array(args.engram_layout.multipliers(), dtype=np.int64)        # [L, max_ngram]
        primes = np.array(args.engram_layout.table_sizes(), dtype=np.int64)                  # [L, n_columns]
        self.primes = primes.reshape(len(primes), self.max_ngram - 1, self.n_heads)         # [L, N-1, H]
        self.offsets = np.array(args.engram_layout.offsets(), dtype=np.int64)                # [L, n_columns]
        self._column_primes = primes  # columns: n-gram size major, head minor

    def __call__(self, history: np.ndarray, positions: np.ndarray, pad: int) -> np.ndarray:
        """history int64 [B, T] (DEAD = masked; already holding the ids at `positions`), positions [B, S]
        → row ids int64 [B, S, L, n_columns]."""
        blocked = np.zeros(positions.shape, dtype=bool)
        mixed = None
        per_size = []
        for s in range(self.max_ngram):
            src_pos = positions - s
            src = np.take_along_axis(history, np.maximum(src_pos, 0), axis=1)              # [B, S] = c[t - s]
            # Cumulative: a look-back that reaches before the sequence start or through a DEAD position
            # is padded, and so is every longer one.
            blocked |= (src_pos < 0) | (src == DEAD)
            tok = np.where(blocked, pad, src)
            term = tok[:, :, None] * self.multipliers[:, s]                                 # [B, S, L]; < 2^63
            mixed = term if mixed is None else mixed ^ term                                 # >= 0
            if s >= 1:                                                                      # an (s+1)-gram
                per_size.append(np.repeat(mixed[..., None], self.n_heads, axis=-1))        # [B, S, L, H]
        hashed = np.concatenate(per_size, axis=-1)                                          # [B, S, L, n_columns]
        return hashed % self._column_primes + self.offsets


class NgramHasher:
    """Row ids into each Engram layer's embedding table, with the per-sequence history that decode needs.

    Row b of every call is sequence slot b. `history[b][t]` is the compressed id of position t (DEAD where
    the Engram mask was False), so a call at start_pos continues from earlier calls exactly.
    """

    def __init__(self, args: "ModelArgs", token_map: np.ndarray):
        if not args.has_engram:
            raise InputError("this config has no Engram layers (engram_layer_ids is empty)")
        token_map = np.asarray(token_map)
        if token_map.ndim != 1 or not np.issubdtype(token_map.dtype, np.integer):
            raise InputError(f"token_map must be a 1-D integer array, got {token_map.dtype} {token_map.shape}")
        if token_map.min() < 0 or token_map.max() >= args.engram_compressed_vocab_size:
            # The multipliers are bounded so that c·m fits in int64 only for c < engram_compressed_vocab_size.
            raise InputError(f"token_map values must lie in 0..{args.engram_compressed_vocab_size - 1} "
                             f"(engram_compressed_vocab_size), got {token_map.min()}..{token_map.max()}")
        if not 0 <= args.engram_pad_id < len(token_map):
            raise InputError(f"engram_pad_id {args.engram_pad_id} is outside the token map (size {len(token_map)})")
        self.args = args
        self.token_map = token_map.astype(np.int64, copy=False)
        self.pad = int(self.token_map[args.engram_pad_id])
        self.hash = NgramHash(args)
        self.multipliers, self.primes, self.offsets = self.hash.multipliers, self.hash.primes, self.hash.offsets
        self._history = np.full((0, 64), DEAD, dtype=np.int64)                               # [rows, capacity]
        self._length: list[int] = []

    # history -----------------------------------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return len(self._length)

    def length(self, row: int = 0) -> int:
        """Number of positions of sequence `row` already hashed (0 for a row never used)."""
        return self._length[row] if row < self.n_rows else 0

    def history(self, row: int = 0) -> np.ndarray:
        """Copy of the compressed ids recorded for positions 0..length-1 of `row` (DEAD = masked)."""
        return self._history[row, : self.length(row)].copy() if row < self.n_rows else np.zeros(0, np.int64)

    def rollback(self, pos: int | Sequence[int], rows: Sequence[int] | None = None) -> None:
        """Forget positions >= pos (per row if pos is a sequence), e.g. rejected speculative tokens."""
        rows = range(self.n_rows) if rows is None else rows
        targets = [pos] * len(rows) if np.ndim(pos) == 0 else list(pos)
        if len(targets) != len(rows):
            raise InputError(f"rollback got {len(targets)} positions for {len(rows)} rows")
        for row, p in zip(rows, targets):
            if not 0 <= p <= self.length(row):
                raise InputError(f"cannot roll row {row} back to position {p}: it holds {self.length(row)} positions")
            if row < self.n_rows:
                self._length[row] = int(p)

    def reset(self) -> None:
        """Forget every sequence."""
        self._history, self._length = self._history[:0], []

    def _make_room(self, n_rows: int, n_positions: int) -> None:
        """Grow the history to at least n_rows rows and n_positions positions (new entries DEAD)."""
        rows, capacity = self._history.shape
        if n_rows > rows or n_positions > capacity:
            wide = capacity if n_positions <= capacity else max(n_positions, 2 * capacity)
            grown = np.full((max(n_rows, rows), wide), DEAD, dtype=np.int64)
            grown[:rows, :capacity] = self._history
            self._history = grown
        self._length += [0] * (n_rows - len(self._length))

    # hashing -----------------------------------------------------------------------------------------
    def compressed_ids(self, ids, engram_mask=None) -> np.ndarray:
        """int64 [B, S]: the compressed id of each token, DEAD where engram_mask is False (no history change)."""
        ids = as_batch(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.token_map)):
            bad = ids[(ids < 0) | (ids >= len(self.token_map))][0]
            raise InputError(f"token id {bad} is outside 0..{len(self.token_map) - 1}")
        c = self.token_map[ids]
        if engram_mask is not None:
            mask = as_batch(engram_mask, "engram_mask").astype(bool)
            if mask.shape != ids.shape:
                raise InputError(f"engram_mask has shape {mask.shape}, ids have {ids.shape}")
            c = np.where(mask, c, DEAD)
        return c

    def __call__(self, ids, start_pos: int | Sequence[int] = 0, engram_mask=None) -> np.ndarray:
        """Row ids int64 [B, S, n_engram_layers, n_columns] for tokens at positions start_pos.. of each row.

        start_pos (one int, or one per row) may be at most the row's history length; a smaller value
        overwrites the positions from there on, exactly as rollback(start_pos) and then this call would.
        """
        c = self.compressed_ids(ids, engram_mask)                                           # [B, S]
        B, S = c.shape
        starts = np.asarray(start_pos, dtype=np.int64).reshape(-1)
        if starts.size not in (1, B):
            raise InputError(f"start_pos has {starts.size} entries for a batch of {B} rows")
        starts = np.broadcast_to(starts, (B,))
        for b in range(B):  # check every row before changing any history
            if not 0 <= starts[b] <= self.length(b):
                raise InputError(f"row {b}: start_pos {starts[b]} is not within 0..{self.length(b)} "
                                 f"(the positions this row has hashed); call rollback() or reset() first")
        positions = starts[:, None] + np.arange(S)                                          # [B, S]
        self._make_room(B, int(positions.max(initial=0)) + 1)
        for b in range(B):
            self._history[b, starts[b]: starts[b] + S] = c[b]
            self._length[b] = int(starts[b]) + S
        return self.hash(self._history[:B], positions, self.pad)
