"""TokenSlots: the (row, position) slots the budget's max_tokens admits; CallTokens: one record call's tokens."""
from __future__ import annotations

import numpy as np


class CallTokens:
    """The tokens of one record call, worked out once for all the layers of a forward: rows [B], positions
    [B, S], keep [B·S] (None: the budget kept all) and refused; the kept tokens' flat rows and positions; per
    row (row, first, last position); ordered: rows distinct and positions rising within each row, so that
    one record never holds a (row, pos) twice; direct: one row, all kept, so fields [1, S, ...] are copied as
    they are; single: (row, pos) of a call of one kept token (decode), else None."""
    __slots__ = ("rows", "positions", "keep", "refused", "flat_rows", "flat_pos", "spans", "ordered", "direct",
                 "single")

    def __init__(self, rows: list[int], positions: np.ndarray, keep: np.ndarray | None, refused: int) -> None:
        b, s = positions.shape
        self.rows, self.positions, self.keep, self.refused = rows, positions, keep, refused
        self.direct = b == 1 and keep is None
        flat_pos = positions.reshape(b * s)
        flat_rows = np.asarray(rows, np.int64) if s == 1 else np.repeat(np.asarray(rows, np.int64), s)
        self.flat_rows = flat_rows if keep is None else flat_rows[keep]
        self.flat_pos = flat_pos if keep is None else flat_pos[keep]
        if s == 1:
            self.spans = [(row, p, p) for row, p in zip(rows, flat_pos.tolist())]
        else:
            self.spans = [(row, int(p.min()), int(p.max())) for row, p in zip(rows, positions)] if s else []
        self.ordered = len(set(rows)) == b and (s < 2 or bool((positions[:, 1:] > positions[:, :-1]).all()))
        self.single = self.spans[0][:2] if self.direct and s == 1 else None


class TokenSlots:
    """The token slots a Trace keeps facts for. Every record call asks admit() about its [B, S] tokens."""

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens
        self.by_row: dict[int, set[int]] = {}   # every row asked about (kept even when it holds no slot)
        self.count = 0
        self.epoch = 0                          # counts the times slots were freed or added from outside

    def admit(self, rows: list[int], positions: np.ndarray) -> CallTokens:
        """The call's tokens, taking new slots in row-major order while the budget lasts. (An answer stays true
        for the same tokens until the epoch changes: no slot is freed in between, so the kept stay kept and the
        refused refused.)"""
        keep, refused = None, 0
        s = positions.shape[1]
        for i, row in enumerate(rows):
            taken = self.by_row.setdefault(row, set())
            for j, pos in enumerate(positions[i].tolist()):
                if pos in taken:
                    continue
                if self.max_tokens is not None and self.count >= self.max_tokens:
                    if keep is None:
                        keep = np.ones(len(rows) * s, bool)
                    keep[i * s + j] = False
                    refused += 1
                    continue
                taken.add(pos)
                self.count += 1
        return CallTokens(rows, positions, keep, refused)

    def add_many(self, rows: list[int], positions: list[int]) -> None:
        """Slots of a rebuilt trace (its budget was honoured when it was recorded)."""
        for row, pos in zip(rows, positions):
            taken = self.by_row.get(row)
            if taken is None:
                taken = self.by_row[row] = set()
            if pos not in taken:
                taken.add(pos)
                self.count += 1
        self.epoch += 1

    def drop_from(self, row: int, pos: int) -> None:
        """Free the row's slots at positions >= pos."""
        taken = self.by_row.get(row, set())
        gone = {p for p in taken if p >= pos}
        taken -= gone
        self.count -= len(gone)
        self.epoch += 1
