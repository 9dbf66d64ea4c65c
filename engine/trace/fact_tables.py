"""The fact tables built from a Trace's columns, whole columns at a time (what tables.py builds record by record)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..spec.errors import InputError
from .records import FACT_FIELDS

# The table's value column of each fact field (moe's [k] fields become one table row per routed slot).
TABLE_NAMES = {"moe": ("expert", "weight", "score", "vision")}


def fact_table(table: str, blocks: list, keys: dict[str, str], values: dict[str, str], pad: dict,
               names: Callable[[str, tuple[int, ...]], list[str]]) -> tuple[dict, dict] | None:
    """(columns, schema) of a fact table from Trace.fact_columns blocks, or None where the record-by-record path
    must build it (no records; moe slots whose count varies). keys/values: the table's KEYS and VALUES; pad:
    the padding of ragged fields per dtype; names(field, shape): a field's flat column names."""
    counts = np.array([len(b[2]) for b in blocks], np.int64)
    if not counts.sum():
        return None
    n_fields = len(FACT_FIELDS[table])
    table_names = TABLE_NAMES.get(table, FACT_FIELDS[table])
    shapes = [_shapes(blocks, i) for i in range(n_fields)]
    if table == "moe":  # ids, weights, scores [k]; vision a scalar: k table rows per token
        slots = set().union(*shapes[:3])
        if len(slots) != 1 or len(next(iter(slots))) != 1 or shapes[3] != {()}:
            return None
    for name, found in zip(table_names, shapes):
        if len(found) > 1 and any(len(s) != 1 for s in found):
            raise InputError(f"trace table {table}: field '{name}' has varying shapes {sorted(found)}; only 1-D "
                             "fields may vary in length")
    fields = [_stack(blocks, i) for i in range(n_fields)]  # [N, *width]
    repeat = 1
    if table == "moe":
        repeat = next(iter(shapes[0]))[0]
        fields = [f[:, :repeat].reshape(-1) for f in fields[:3]] + [np.repeat(fields[3], repeat)]
        shapes = [{()}] * 4
    cols = {key: _key_column(key, dtype, blocks, counts, repeat) for key, dtype in keys.items()}
    schema = {}
    for i, (name, array, found) in enumerate(zip(table_names, fields, shapes)):
        dtype = values[name]
        array = array.astype(dtype, copy=False)
        if len(found) == 1:
            shape = next(iter(found))
            array = array[(slice(None), *(slice(0, d) for d in shape))]  # (padding left by rolled-back entries)
            if shape == ():
                cols[name], schema[name] = array.reshape(-1), {"shape": []}
                continue
            flat = array.reshape(len(array), int(np.prod(shape)))  # [N, prod(shape)]
            cols.update({n: np.ascontiguousarray(flat[:, j]) for j, n in enumerate(names(name, shape))})
            schema[name] = {"shape": list(shape)}
            continue
        lengths = np.concatenate([_lengths(b, i) for b in blocks])  # (moe never gets here: its slots are uniform)
        width = int(lengths.max())
        padded = np.full((len(array), width), pad[dtype], dtype=dtype)
        filled = np.arange(width) < lengths[:, None]  # [N, width]: each entry's cells before its end
        padded[filled] = array[:, :width][filled]
        cols.update({n: np.ascontiguousarray(padded[:, j]) for j, n in enumerate(names(name, (width,)))})
        cols[f"{name}_len"] = lengths
        schema[name] = {"shape": [width], "ragged": True}
    return cols, schema


def _shapes(blocks: list, i: int) -> set[tuple[int, ...]]:
    """The distinct per-entry shapes of field i."""
    found = set()
    for block in blocks:
        values, shapes = block[4][i]
        found.update({tuple(values.shape[1:])} if shapes is None else map(tuple, np.unique(shapes, axis=0).tolist()))
    return found


def _stack(blocks: list, i: int) -> np.ndarray:
    """Field i of every block as one [N, *width] array (blocks of narrower width padded; never read)."""
    parts = [block[4][i][0] for block in blocks]
    widths = {p.shape[1:] for p in parts}
    if len(widths) == 1:
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
    width = tuple(max(dims) for dims in zip(*widths))
    out = np.zeros((sum(len(p) for p in parts), *width), parts[0].dtype)
    start = 0
    for p in parts:
        out[(slice(start, start + len(p)), *(slice(0, d) for d in p.shape[1:]))] = p
        start += len(p)
    return out


def _lengths(block, i: int) -> np.ndarray:
    values, shapes = block[4][i]
    return shapes[:, 0].astype(np.int64) if shapes is not None else np.full(len(values), values.shape[1], np.int64)


def _key_column(key: str, dtype: str, blocks: list, counts: np.ndarray, repeat: int) -> np.ndarray:
    if key in ("path", "site"):
        return np.repeat(np.array([b[0 if key == "path" else 1] for b in blocks], dtype=object), counts * repeat)
    if key == "slot":
        return np.tile(np.arange(repeat, dtype=np.int64), int(counts.sum()))
    return np.repeat(np.concatenate([b[2 if key == "row" else 3] for b in blocks]), repeat).astype(dtype)
