"""FactColumns: one (kind, path, site)'s records as preallocated, growable numpy columns (row, pos, one per field)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .field_column import FieldColumn
from .records import arrays_equal
from .slots import CallTokens

if TYPE_CHECKING:  # tensors come from the model's side: named for annotations only
    from .arrays import Array

FIRST_CAPACITY = 64  # entries; capacity doubles when full


class FactColumns:
    """The records of one (kind, path, site): entries in arrival order, at most one per (row, pos)."""

    def __init__(self, where: str, fields: dict[str, object]) -> None:
        self.where = where  # "record_moe(layers.3.ffn)": names the call in errors
        self.n = 0
        self.capacity = FIRST_CAPACITY
        self.rows = np.empty(self.capacity, np.int64)
        self.pos = np.empty(self.capacity, np.int64)
        self.fields = [FieldColumn(name, dtype) for name, dtype in fields.items()]
        self.max_pos: dict[int, int] = {}   # row -> an upper bound of its recorded positions (-1: none)
        self._index: dict[tuple[int, int], int] | None = None   # (row, pos) -> entry, built on first lookup

    # ---- writing ----------------------------------------------------------------------------------
    def record(self, call: CallTokens, values: list[np.ndarray]) -> None:
        """One model call: values [B, S, ...] per field for the call's tokens (the kept ones are stored). A
        (row, pos) recorded before is replaced: the last record wins."""
        if call.single is not None:  # decode: one row, one token
            row, pos = call.single
            if pos > self.max_pos.get(row, -1):
                self.max_pos[row] = pos
                self._append_one(row, pos, values)
                return
        fresh = call.ordered
        max_pos = self.max_pos
        for row, lo, hi in call.spans:  # positions past every recorded one of their row cannot replace anything
            bound = max_pos.get(row, -1)
            if lo <= bound:
                fresh = False
            if hi > bound:
                max_pos[row] = hi
        if fresh and call.direct:  # [1, S, ...] fills S entries as it is
            self.append(call.flat_rows, call.flat_pos, values, lead=2)
            return
        flat = [v.reshape(v.shape[0] * v.shape[1], *v.shape[2:]) for v in values]  # [B·S, ...]
        if call.keep is not None:
            flat = [v[call.keep] for v in flat]
        rows, pos = call.flat_rows, call.flat_pos
        if not fresh:
            rows, pos, flat = self._replacing(rows, pos, flat)
        self.append(rows, pos, flat)

    def record_one(self, row: int, pos: int, values: tuple) -> bool:
        """The decode fast path: one new token's CPU tensors (or arrays), [1, 1, ...] each, of full width (or, in a
        ragged field, no wider than its buffer), copied in; False (with nothing recorded) for anything else, which
        record() then handles."""
        if pos <= self.max_pos.get(row, -1):
            return False
        n = self.n
        if n == self.capacity:
            self._grow(n + 1)
        for column, v in zip(self.fields, values):
            if type(v) is not np.ndarray:
                try:
                    v = v.numpy()
                except (AttributeError, RuntimeError, TypeError):  # not a plain CPU tensor
                    return False
            if v.shape == column.one_shape:
                column.buf[n:n + 1] = v  # (entry n counts only once every field is in)
                if column.shapes is not None:
                    column.shapes[n] = column.one_shape[2:]
            elif not column.write_narrower(n, v):
                return False
        self.rows[n] = row
        self.pos[n] = pos
        self.max_pos[row] = pos
        self.n = n + 1
        self._index = None
        return True

    def _replacing(self, rows: np.ndarray, pos: np.ndarray, values: list[np.ndarray]):
        """Drop the stored entries that the new ones replace, and all but the last of any (row, pos) given twice."""
        last = {k: i for i, k in enumerate(zip(rows.tolist(), pos.tolist()))}
        stored = zip(self.rows[: self.n].tolist(), self.pos[: self.n].tolist())
        self.drop(np.fromiter((k in last for k in stored), bool, self.n))
        chosen = np.array(sorted(last.values()), np.int64)
        return rows[chosen], pos[chosen], [v[chosen] for v in values]

    def _append_one(self, row: int, pos: int, values: list[np.ndarray]) -> None:
        """append() for one entry, values [1, 1, ...] per field (scalar writes for its row and position)."""
        n = self.n
        if n == self.capacity:
            self._grow(n + 1)
        self.rows[n] = row
        self.pos[n] = pos
        for column, v in zip(self.fields, values):
            buf = column.buf
            if buf is not None and column.shapes is None and v.shape[2:] == buf.shape[1:]:
                buf[n:n + 1] = v  # (numpy drops the leading 1s of [1, 1, ...])
            else:
                column.write(n, v.reshape(1, *v.shape[2:]), self.capacity, self.where)
        self.n = n + 1
        self._index = None

    def append(self, rows: Array, pos: np.ndarray, values: list[np.ndarray], lead: int = 1,
               lengths: dict[int, np.ndarray] | None = None) -> None:
        """m new entries: rows [m], pos [m], one [m, *tail] array per field (lead=2: [1, m, *tail]). The (row, pos)
        pairs must be new. lengths[f]: field f's entries are 1-D of these lengths, values [m, w] padded."""
        m = len(pos)
        start, end = self.n, self.n + m
        if end > self.capacity:
            self._grow(end)
        self.rows[start:end] = rows
        self.pos[start:end] = pos
        for f, (column, v) in enumerate(zip(self.fields, values)):
            buf = column.buf
            if lengths and f in lengths:
                column.write_lengths(start, v, lengths[f], self.capacity, self.where)
            elif buf is not None and column.shapes is None and v.shape[lead:] == buf.shape[1:]:
                buf[start:end] = v  # the common case: one copy (numpy drops the leading 1 of [1, m, ...])
            else:
                column.write(start, v.reshape(m, *v.shape[lead:]), self.capacity, self.where)
        self.n = end
        self._index = None

    def extend(self, rows: list[int], pos: list[int], entries: list[tuple]) -> None:
        """Entries of a rebuilt trace (new, distinct (row, pos) pairs): entries[i] holds the i-th one's field
        values. Appended field by field in runs of entries whose shapes agree."""
        per_field = list(zip(*entries))
        shapes = [[getattr(v, "shape", ()) for v in values] for values in per_field]
        varying = [s for s in shapes if s.count(s[0]) != len(s)]  # (ragged fields: an index list that grew)
        signature = list(zip(*varying)) if varying else None
        start = 0
        for end in range(1, len(rows) + 1):
            if end == len(rows) or (signature is not None and signature[end] != signature[start]):
                self.append(np.asarray(rows[start:end], np.int64), np.asarray(pos[start:end], np.int64),
                            [np.array(v[start:end], column.dtype) for v, column in zip(per_field, self.fields)])
                start = end
        for row, p in zip(rows, pos):
            if p > self.max_pos.get(row, -1):
                self.max_pos[row] = p

    def put(self, rows: np.ndarray, pos: np.ndarray, values: list[np.ndarray],
            lengths: dict[int, np.ndarray] | None = None) -> None:
        """m entries made from other records (the lens's, the seams', a StepTable's): rows [m], pos [m] distinct
        pairs, values [m, *tail] per field (lengths: as for append); each replaces an entry stored at the same
        (row, pos)."""
        by_row = [(row, pos[rows == row]) for row in np.unique(rows).tolist()]
        if self.n and any(int(p.min()) <= self.max_pos.get(row, -1) for row, p in by_row):  # (else all are new)
            new = set(zip(rows.tolist(), pos.tolist()))
            stored = zip(self.rows[: self.n].tolist(), self.pos[: self.n].tolist())
            self.drop(np.fromiter((k in new for k in stored), bool, self.n))
        self.append(rows, pos, values, lengths=lengths)
        for row, p in by_row:
            self.max_pos[row] = max(self.max_pos.get(row, -1), int(p.max()))

    def drop(self, remove: np.ndarray) -> None:
        """Forget the entries where remove [n] is True. Entries left keep their values; when the removed ones are
        the newest, the buffers are only cut back (later records reuse those slots)."""
        hit = np.flatnonzero(remove)
        if not hit.size:
            return
        first = int(hit[0])
        if hit.size == self.n - first:  # a suffix (a rollback of the latest tokens): cut, no copying
            self.n = first
        else:  # new buffers: arrays handed out earlier keep their values
            keep = np.flatnonzero(~remove)
            for column in self.fields:
                column.resize(self.capacity, keep)
            self.rows[: keep.size] = self.rows[keep]
            self.pos[: keep.size] = self.pos[keep]
            self.n = keep.size
        self._index = None

    def drop_from(self, row: int, pos: int) -> None:
        """Forget the row's entries at positions >= pos."""
        if self.max_pos.get(row, -1) < pos:
            return
        self.drop((self.rows[: self.n] == row) & (self.pos[: self.n] >= pos))
        self.max_pos[row] = pos - 1

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.capacity)
        for name in ("rows", "pos"):
            new = np.empty(capacity, np.int64)
            new[: self.n] = getattr(self, name)[: self.n]
            setattr(self, name, new)
        for column in self.fields:
            column.resize(capacity, self.n)
        self.capacity = capacity

    # ---- reading ----------------------------------------------------------------------------------
    def find(self, row: int, pos: int) -> int | None:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(zip(self.rows[: self.n].tolist(), self.pos[: self.n].tolist()))}
        return self._index.get((row, pos))

    def entry(self, i: int) -> tuple:
        return tuple(column.value(i) for column in self.fields)

    def entries(self, order: np.ndarray) -> list[tuple]:
        """entry(i) for each i in order (views of the columns), built field by field."""
        idx = order.tolist()
        per_field = [column.values(self.n) for column in self.fields]
        return list(zip(*([values[i] for i in idx] for values in per_field)))

    def block(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray | None]]]:
        """(rows, pos, [(values [m, *width], shapes [m, ndim] or None) per field]) of the entries in order."""
        return self.rows[order], self.pos[order], [column.take(order) for column in self.fields]

    def order(self) -> np.ndarray:
        """Entry indices sorted by (row, pos)."""
        return np.lexsort((self.pos[: self.n], self.rows[: self.n]))

    def same_as(self, other: FactColumns) -> bool:
        """The same (row, pos) entries with equal values (NaN equal to NaN), whatever the arrival order."""
        if self.n != other.n:
            return False
        if not self.n:
            return True
        mine, theirs = self.order(), other.order()
        same_keys = np.array_equal(self.rows[mine], other.rows[theirs]) and \
            np.array_equal(self.pos[mine], other.pos[theirs])
        if not same_keys:
            return False
        for a, b in zip(self.fields, other.fields):
            (va, sa), (vb, sb) = a.take(mine), b.take(theirs)
            if sa is None and sb is None:
                if va.shape != vb.shape or not np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"):
                    return False
            elif not all(arrays_equal(a.value(i), b.value(j)) for i, j in zip(mine.tolist(), theirs.tolist())):
                return False
        return True
