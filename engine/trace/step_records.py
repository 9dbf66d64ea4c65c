"""StepRecords: a decode step's one-token records, kept as the model's tensors until the step ends, then stacked."""
from __future__ import annotations

from collections.abc import Callable

from .records import RECORDED_DTYPES
from .step_table import StepTable

RAGGED_FIELDS = {"attention": (0,)}   # fields whose length changes step by step (the index list grows with the context)


class StepRecords:
    """What FactRecorder._defer keeps of one forward's one-token calls (the layers of a decode step), and the
    StepTables they go into when the step ends: one copy per kind and field for the whole step instead of a few
    numpy calls per record and field between the model's ops. The values must stay as they are until then (the
    token record, the next forward, a rollback or any read): the engine's model makes new tensors for them."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[list, list]] = {}   # kind -> ([key], [values]) in arrival order
        self.tables: dict[str, StepTable] = {}          # kind -> the rows of its steps so far
        self.untabled: set[str] = set()                 # kinds written record by record (their values do not stack)

    def keep(self, key: tuple[str, str, str], values: tuple) -> None:
        kept = self.kept.get(key[0])
        if kept is None:
            self.kept[key[0]] = ([key], [values])
        else:
            kept[0].append(key)
            kept[1].append(values)

    def write(self, row: int, pos: int, columns_get: Callable, columns_for: Callable, checked: Callable) -> None:
        """End the step of token (row, pos): a kind whose records are laid out as the steps' before (the same
        keys, fields of the same shapes) becomes a row of its StepTable; any other record goes into its columns
        (columns_get(key)) where those take it as it is (record_one), else to checked(key, values)."""
        kept, self.kept = self.kept, {}
        for kind, (keys, values) in kept.items():   # (kinds are independent: each key keeps its order)
            if kind not in self.untabled and self._tabled(kind, row, pos, tuple(keys), values, columns_for):
                continue
            self.drain(columns_for, kind)
            for key, v in zip(keys, values):
                columns = columns_get(key)
                if columns is None or not columns.record_one(row, pos, v):
                    checked(key, v)

    def drain(self, columns_for: Callable, kind: str | None = None, key: tuple | None = None) -> None:
        """Move a kind's table rows (every kind's: kind None; only if it holds `key`: key) into the columns."""
        if key is not None:
            table = self.tables.get(key[0])
            if table is not None and table.n and key in table.keys:
                table.drain(columns_for)
            return
        for table in self.tables.values() if kind is None else [self.tables.get(kind)]:
            if table is not None and table.n:
                table.drain(columns_for)

    def _tabled(self, kind: str, row: int, pos: int, keys: tuple, values: list, columns_for: Callable) -> bool:
        """The step's records of a kind as a row of its StepTable (a new table where the layout changed): True, or
        False with nothing kept."""
        table = self.tables.get(kind)
        if table is not None and table.add(row, pos, keys, values):
            return True
        self.drain(columns_for, kind)
        try:
            table = self.tables[kind] = StepTable(keys, RECORDED_DTYPES[kind], values, RAGGED_FIELDS.get(kind, ()))
        except (AttributeError, IndexError, TypeError):  # a value without its shape (the checked path names it)
            table = None
        if table is None or not table.add(row, pos, keys, values):  # (bf16 values, say: not this trace's way)
            self.tables.pop(kind, None)
            self.untabled.add(kind)
            return False
        return True
