"""FieldColumn: one fact field's values as a growable numpy array (padded where entry shapes vary)."""
from __future__ import annotations

import numpy as np

from ..spec.errors import InputError


class FieldColumn:
    """One field's values: a [capacity, *width] array. While every entry has the same shape, width is that
    shape; once shapes differ (an index list that grows), `shapes` [capacity, ndim] holds each entry's own
    shape and `buf` is padded to the widest (the padding is never read)."""

    def __init__(self, name: str, dtype):
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
        wider = tuple(max(a, b) for a, b in zip(width, tail))
        if wider != width:
            grown = np.zeros((len(self.buf), *wider), self.dtype)
            grown[(slice(0, start), *(slice(0, d) for d in width))] = self.buf[:start]
            self.buf, self.one_shape = grown, (1, 1, *wider)
        self.buf[(slice(start, start + len(values)), *(slice(0, d) for d in tail))] = values
        self.shapes[start:start + len(values)] = tail

    def value(self, i: int):
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
