"""StepTable: one kind's one-token records of consecutive decode steps, kept step-major until the trace is read."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the recorder hands its rows on to the columns: named for annotations only
    from .columns import FactColumns

FIRST_STEPS = 64  # rows; capacity doubles when full


class StepTable:
    """The records of one kind that each decode step makes, the same keys in the same order every step: field f
    of a step's k records is stacked by one torch.cat (the copy out of the model's tensors) into row n of an array
    [steps, k, *shape], so a step costs one copy per field instead of one per field and record. A ragged field (an
    index list whose length changes step by step) is copied record by record into [steps, k, width] with its
    lengths beside. drain() moves the rows into the FactColumns, one copy per key and field."""

    def __init__(self, keys: tuple, dtypes: tuple, first: list[tuple], ragged: tuple[int, ...] = ()) -> None:
        """keys: the step's (kind, path, site) in record order; first: the first step's values, per key; ragged:
        the fields that are 1-D lists of any length."""
        k = len(keys)
        self.keys, self.ragged = keys, ragged
        self.shapes = [(k, 1, *v.shape[2:]) for v in first[0]]   # [k, 1, *shape]: a field stacked
        for f in ragged:                                          # [k, width]: the step's longest list
            self.shapes[f] = (k, max(v[f].shape[2] for v in first))
        self.n = 0
        self.rows = np.empty(FIRST_STEPS, np.int64)
        self.pos = np.empty(FIRST_STEPS, np.int64)
        self.fields = [np.empty((FIRST_STEPS, k, *(shape[1:] if f in ragged else shape[2:])), dtype)
                       for f, (shape, dtype) in enumerate(zip(self.shapes, dtypes))]
        self.lengths = {f: np.empty((FIRST_STEPS, k), np.int64) for f in ragged}
        self.newest: dict[int, int] = {}   # row -> its newest position here
        self._places: tuple | None = None   # ((widths, row width), where a ragged row's lists go) of the last step

    def add(self, row: int, pos: int, keys: tuple, values: list[tuple]) -> bool:
        """The step's records of these keys (values: per key, one [1, 1, *shape] tensor or array per field) as
        row n; False, with nothing kept, when the step is laid out otherwise (other keys, a field of another shape
        or of a dtype numpy lacks) or pos is not past the row's newest here (each (row, pos) must be new)."""
        if keys != self.keys or pos <= self.newest.get(row, -1):
            return False
        n = self.n
        if n == len(self.rows):
            self._grow()
        for f, (buf, shape) in enumerate(zip(self.fields, self.shapes)):
            parts = [v[f] for v in values]
            if f in self.lengths:
                if not self._add_ragged(f, n, parts):
                    return False
                continue
            try:
                stacked = np.concatenate(parts) if type(parts[0]) is np.ndarray else _cat(parts)
            except (RuntimeError, TypeError, ValueError):  # shapes differ, bf16, a GPU tensor among them
                return False
            if stacked.shape != shape:
                return False
            buf[n] = stacked[:, 0]  # (row n counts only once every field is in)
        self.rows[n], self.pos[n] = row, pos
        self.newest[row] = pos
        self.n = n + 1
        return True

    def drain(self, columns_for: Callable[[str, str, str], FactColumns]) -> None:
        """Hand every row to the FactColumns (columns_for(kind, path, site)) and empty the table."""
        n = self.n
        if not n:
            return
        rows, pos = self.rows[:n], self.pos[:n]
        for j, key in enumerate(self.keys):
            columns_for(*key).put(rows, pos, [buf[:n, j] for buf in self.fields],
                                  {f: lengths[:n, j] for f, lengths in self.lengths.items()})
        self.n = 0
        self.newest.clear()

    def _add_ragged(self, f: int, n: int, parts: list) -> bool:
        """Row n of ragged field f: the step's lists [1, 1, width] joined by one concatenate and scattered into the
        row [k, width] at the places their widths give (kept for the next step, which mostly has the same widths:
        one layout only, as a long run on a large model passes through thousands; the buffer widens, doubling, for
        a longer list). One op per step instead of a few per list: each costs microseconds here,
        between two forwards."""
        try:
            joined = np.concatenate(parts, axis=2) if type(parts[0]) is np.ndarray else _cat(parts, 2)
        except (RuntimeError, TypeError, ValueError):  # not all [1, 1, *], bf16, a GPU tensor among them
            return False
        if joined.ndim != 3 or joined.shape[:2] != (1, 1):
            return False
        widths = tuple(v.shape[2] for v in parts)
        buf = self.fields[f]
        if max(widths) > buf.shape[2]:  # (the rows so far come along)
            grown = np.empty((len(buf), len(self.keys), max(max(widths), 2 * buf.shape[2])), buf.dtype)
            grown[:n, :, : buf.shape[2]] = buf[:n]
            buf = self.fields[f] = grown
        layout = (widths, buf.shape[2])
        if self._places is None or self._places[0] != layout:  # where each list's entries go in a row [k, width]
            self._places = (layout, np.concatenate([j * buf.shape[2] + np.arange(w, dtype=np.int64)
                                                    for j, w in enumerate(widths)]))
        places = self._places[1]
        buf[n].reshape(-1)[places] = joined.reshape(-1)
        self.lengths[f][n] = widths
        return True

    def _grow(self) -> None:
        capacity = 2 * len(self.rows)
        self.rows, self.pos = (np.resize(a, capacity) for a in (self.rows, self.pos))
        grown = []
        for buf in self.fields:
            new = np.empty((capacity, *buf.shape[1:]), buf.dtype)
            new[: self.n] = buf[: self.n]
            grown.append(new)
        self.fields = grown
        self.lengths = {f: np.resize(a, (capacity, a.shape[1])) for f, a in self.lengths.items()}


def _cat(tensors: list, dim: int = 0):
    """The tensors joined on a dim, as a numpy array (a view of the new tensor)."""
    return sys.modules["torch"].cat(tensors, dim).numpy()   # (only tensors get here: torch is loaded)
