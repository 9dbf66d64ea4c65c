"""FieldColumn: one fact field's values as a growable numpy array (padded where entry shapes vary)."""
from __future__ import annotations

import numpy as np

from ..spec.errors import InputError


class FieldColumn:
    """One field's values: a [capacity, *width] array. While every entry has the same shape, width is that
    shape; once shapes differ (an index list that grows), `shapes` [capacity, ndim] holds each entry's own
    shape and `buf` is padded to the widest (the padding is never read)."""

    def __init__(self, name: str, dtype: np.dtype | str) -> None:
        self.name, self.dtype = name, np.dtype(dtype)
        self.buf: np.ndarray | None = None
        self.shapes: np.ndarray | None = None
        self.one_shape: tuple | None = None   # (1, 1, *width): the shape of a one-token record at full width

    def write(self, start: int, values: np.ndarray, capacity: int, where: str) -> None:
        """values [m, *tail] into entries start..start+m-1."""
        tail = values.shape[1:]
        if self.buf is None:
            self.buf = np.empty((capacity, *tail), self.dtype)
            self.one_shape = (1, 1, *tail)
        width = self.buf.shape[1:]
        if tail == width:
            self.buf[start:start + len(values)] = values
            if self.shapes is not None:
                self.shapes[start:start + len(values)] = tail
            return
        if len(tail) != len(width):
            raise InputError(f"{where}: '{self.name}' has shape {tail} after records of shape {width}; a field "
                             "keeps its number of dimensions")
        if self.shapes is None:  # the first entry of another shape: from now on each entry keeps its own
            self.shapes = np.empty((len(self.buf), len(width)), np.int64)
            self.shapes[:start] = width
        # a dimension that grows at least doubles (an index list that widens token by token reallocates rarely)
        wider = tuple(b if a <= b else max(a, 2 * b) for a, b in zip(tail, width))
        if wider != width:
            grown = np.zeros((len(self.buf), *wider), self.dtype)
            grown[(slice(0, start), *(slice(0, d) for d in width))] = self.buf[:start]
            self.buf, self.one_shape = grown, (1, 1, *wider)
        self.buf[(slice(start, start + len(values)), *(slice(0, d) for d in tail))] = values
        self.shapes[start:start + len(values)] = tail

    def write_lengths(self, start: int, values: np.ndarray, lengths: np.ndarray, capacity: int, where: str) -> None:
        """m one-dimensional entries of their own lengths into entries start..start+m-1: values [m, w] (entry i in
        its first lengths[i] cells; the rest is padding, never read), lengths [m] <= w."""
        m, w = values.shape
        if self.buf is None:
            self.buf = np.empty((capacity, w), self.dtype)
            self.one_shape = (1, 1, w)
        if self.buf.ndim != 2:
            raise InputError(f"{where}: '{self.name}' has 1-D entries after records of shape {self.buf.shape[1:]}; a "
                             "field keeps its number of dimensions")
        if self.shapes is None:
            self.shapes = np.empty((len(self.buf), 1), np.int64)
            self.shapes[:start] = self.buf.shape[1]
        need, width = int(lengths.max()) if m else 0, self.buf.shape[1]
        if need > width:
            wider = max(need, 2 * width)
            grown = np.zeros((len(self.buf), wider), self.dtype)
            grown[:start, :width] = self.buf[:start]
            self.buf, self.one_shape, width = grown, (1, 1, wider), wider
        cols = min(w, width)
        self.buf[start:start + m, :cols] = values[:, :cols]
        self.shapes[start:start + m, 0] = lengths

    def write_narrower(self, i: int, v: np.ndarray) -> bool:
        """Entry i of a ragged field from a one-token record v [1, 1, *tail] that fits in the buffer: True; False
        (nothing written) for any other v, which write() then handles."""
        one = self.one_shape
        if self.shapes is None or len(v.shape) != len(one) or v.shape[:2] != (1, 1) or \
                any(a > b for a, b in zip(v.shape[2:], one[2:])):
            return False
        tail = v.shape[2:]
        self.buf[(i, *(slice(0, d) for d in tail))] = v[0, 0]
        self.shapes[i] = tail
        return True

    def value(self, i: int) -> np.ndarray | np.generic:
        """Entry i as a view (a numpy scalar for a scalar field), at its own shape."""
        if self.shapes is None:
            return self.buf[i]
        return self.buf[(i, *(slice(0, int(d)) for d in self.shapes[i]))]

    def values(self, n: int) -> list:
        """value(i) for i < n."""
        if self.shapes is None:
            return list(self.buf[:n])
        return [self.buf[(i, *(slice(0, d) for d in shape))] for i, shape in enumerate(self.shapes[:n].tolist())]

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(values [m, *width], per-entry shapes [m, ndim] or None when all have the width) of entries idx."""
        return self.buf[idx], None if self.shapes is None else self.shapes[idx]

    def resize(self, capacity: int, keep: int | np.ndarray) -> None:
        """New buffers of `capacity` holding the first `keep` entries, or the entries at the indices `keep`."""
        for attr in ("buf", "shapes"):
            old = getattr(self, attr)
            if old is None:
                continue
            kept = old[:keep] if isinstance(keep, int) else old[keep]
            new = np.empty((capacity, *old.shape[1:]), old.dtype)
            new[:len(kept)] = kept
            setattr(self, attr, new)
