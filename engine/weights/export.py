"""Statistics tables to files for notebooks: Parquet (pyarrow, typed columns) or CSV, by the file's suffix; and
back, so that a round trip can be checked."""
from __future__ import annotations

import csv
from pathlib import Path

from ..spec.errors import InputError

FORMATS = (".parquet", ".csv")
INT_COLUMNS = ("layer", "index")
FLOAT_COLUMNS = ("value", "a", "b", "difference")


def write_table(rows: list[dict], path: str | Path) -> Path:
    """rows (dicts with the same keys, e.g. collect.COLUMNS or compare.COMPARE_COLUMNS) → a .parquet or .csv file."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise InputError(f"{path}: export writes {' or '.join(FORMATS)} files (by the suffix), not '{path.suffix}'")
    if not rows:
        raise InputError(f"{path}: nothing to export (no statistics were computed)")
    columns = list(rows[0])
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)
    return path


def read_table(path: str | Path) -> list[dict]:
    """A file write_table wrote, as rows with its typed values (CSV: integers and floats parsed back; an empty
    float cell is None)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in INT_COLUMNS:
            if k in r:
                r[k] = int(r[k])
        for k in FLOAT_COLUMNS:
            if k in r:
                r[k] = float(r[k]) if r[k] != "" else None
    return rows
