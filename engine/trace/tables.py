"""A Trace's contents as flat columnar tables (one 1-D column each, pandas-ready); decode.py reads them back."""
from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import numpy as np

from ..spec.errors import InputError
from .fact_tables import fact_table
from .records import FACT_DTYPES, FACT_FIELDS, DSparkStep, TokenRecord, TraceBudget

FORMAT = "v41viz-trace"
VERSION = 1
TABLES = ("moe", "mhc", "engram", "attention", "tokens", "dspark", "lens")

# Key columns (1-D, always present) and value fields with their dtypes, per table.
KEYS: dict[str, dict[str, str]] = {
    "moe": {"path": "str", "row": "int64", "pos": "int64", "slot": "int64"},
    "mhc": {"path": "str", "site": "str", "row": "int64", "pos": "int64"},
    "engram": {"path": "str", "row": "int64", "pos": "int64"},
    "attention": {"path": "str", "row": "int64", "pos": "int64"},
    "tokens": {"row": "int64", "pos": "int64"},
    "dspark": {"row": "int64", "step": "int64"},
    "lens": {"path": "str", "row": "int64", "pos": "int64"},
}
VALUES: dict[str, dict[str, str]] = {
    "moe": {"expert": "int64", "weight": "float32", "score": "float32", "vision": "bool"},
    "mhc": dict.fromkeys(FACT_FIELDS["mhc"], "float32"),
    "engram": {"compressed_ids": "int64", "row_ids": "int64", "gates": "float32"},
    "attention": {"topk": "int64", "window_mass": "float32", "compressed_mass": "float32", "sink_mass": "float32"},
    "tokens": {"token_id": "int64", "text": "str", "generated": "bool", "step": "int64", "step_time_s": "float64",
               "top_ids": "int64", "top_logits": "float32", "top_probs": "float32", "logprob": "float64"},
    "dspark": {"anchor_pos": "int64", "anchor_token": "int64", "drafted": "int64", "draft_probs": "float32",
               "confidences": "float32", "survival": "float32", "verify_len": "int64", "accepted": "int64",
               "next_token": "int64", "next_kind": "str", "time_s": "float64"},
    "lens": dict(zip(FACT_FIELDS["lens"], FACT_DTYPES["lens"])),
}
PAD = {"int64": -1, "float32": np.nan, "float64": np.nan, "bool": False}
# Fields added after traces were first written: a trace that lacks one still loads (the field reads NaN).
OPTIONAL_FIELDS = {("tokens", "logprob")}
# Tables added after traces were first written: a trace that lacks one (in its header and its tables) loads with
# that table empty.
OPTIONAL_TABLES = ("lens",)


class TraceFormatError(InputError):
    """A trace file or table set that is not a valid v41viz trace; the message says what is wrong."""


class TraceReader(Protocol):
    """What the tables read from a Trace (its public accessors; this module does not import the Trace)."""
    budget: TraceBudget
    meta: dict[str, Any]
    omitted: Counter[str]
    dspark_steps: list[DSparkStep]

    def facts(self, kind: str) -> list[tuple[str, str, int, int, tuple[np.ndarray, ...]]]: ...
    def rows(self) -> list[int]: ...
    def tokens(self, row: int = 0) -> list[TokenRecord]: ...


def build_tables(trace: TraceReader, only: str | None = None) -> tuple[dict[str, dict[str, np.ndarray]], dict[str,
                 Any]]:
    """(tables, header): tables[name][column] are 1-D arrays; header holds budget, meta, omitted and shapes."""
    names = TABLES if only is None else (only,)
    if only is not None and only not in TABLES:
        raise KeyError(f"unknown trace table {only!r}; tables are {', '.join(TABLES)}")
    tables, schema = {}, {}
    for name in names:
        if name in FACT_FIELDS and hasattr(trace, "fact_columns"):  # whole columns at a time
            built = fact_table(name, trace.fact_columns(name), KEYS[name], VALUES[name], PAD, column_names)
            if built is not None:
                tables[name], schema[name] = built
                continue
        records = _records(trace, name)
        keys = {k: [r[0][k] for r in records] for k in KEYS[name]}
        cols = {k: _column(v, KEYS[name][k]) for k, v in keys.items()}
        schema[name] = {}
        for field, dtype in VALUES[name].items():
            values = [r[1][field] for r in records]
            field_cols, schema[name][field] = _field_columns(name, field, values, dtype)
            cols.update(field_cols)
        tables[name] = cols
    header = {"format": FORMAT, "version": VERSION, "budget": trace.budget.to_dict(), "meta": trace.meta,
              "omitted": dict(sorted(trace.omitted.items())), "schema": schema,
              "n_rows": {n: int(len(next(iter(t.values())))) for n, t in tables.items()}}
    return tables, header


# ---- building ---------------------------------------------------------------------------------

def _records(trace: TraceReader, name: str) -> list[tuple[dict, dict]]:
    """(keys, values) per table row."""
    if name == "moe":
        out = []
        for path, _, row, pos, (ids, weights, scores, vision) in trace.facts("moe"):
            for slot in range(ids.shape[0]):
                out.append(({"path": path, "row": row, "pos": pos, "slot": slot},
                            {"expert": ids[slot], "weight": weights[slot], "score": scores[slot], "vision": vision}))
        return out
    if name in FACT_FIELDS:
        return [({"path": path, "site": site, "row": row, "pos": pos}, dict(zip(FACT_FIELDS[name], values)))
                for path, site, row, pos, values in trace.facts(name)]
    if name == "tokens":
        return [({"row": t.row, "pos": t.pos}, vars(t)) for r in trace.rows() for t in trace.tokens(r)]
    return [({"row": s.row, "step": s.step}, vars(s)) for s in trace.dspark_steps]


def _column(values: list, dtype: str) -> np.ndarray:
    if dtype == "str":
        return np.array(values, dtype=object).reshape(len(values))
    return np.array(values, dtype=dtype).reshape(len(values))


def _field_columns(table: str, field: str, values: list, dtype: str) -> tuple[dict[str, np.ndarray], dict]:
    """Flatten one field into 1-D columns: scalars as `field`, fixed shapes as `field_i_j`, ragged
    1-D values padded into `field_i` plus `field_len`."""
    if dtype == "str":
        return {field: _column(values, dtype)}, {"shape": []}
    arrays = [np.asarray(v, dtype=dtype) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) <= 1:
        shape = shapes.pop() if shapes else ()
        stacked = np.stack(arrays).reshape(len(arrays), _size(shape)) if arrays else np.zeros((0, _size(shape)), dtype)
        if shape == ():
            return {field: stacked.reshape(-1)}, {"shape": []}
        names = column_names(field, shape)
        return {n: np.ascontiguousarray(stacked[:, i]) for i, n in enumerate(names)}, {"shape": list(shape)}
    if any(len(s) != 1 for s in shapes):
        raise InputError(f"trace table {table}: field '{field}' has varying shapes {sorted(shapes)}; "
                         "only 1-D fields may vary in length")
    width = max(s[0] for s in shapes)
    padded = np.full((len(arrays), width), PAD[dtype], dtype=dtype)
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    for i, a in enumerate(arrays):
        padded[i, : a.shape[0]] = a
    cols = {n: np.ascontiguousarray(padded[:, i]) for i, n in enumerate(column_names(field, (width,)))}
    cols[f"{field}_len"] = lengths
    return cols, {"shape": [width], "ragged": True}


def column_names(field: str, shape: tuple[int, ...]) -> list[str]:
    """The flat columns of a field of `shape`: field_0, field_1, ... (field_i_j for 2-D)."""
    return [field + "".join(f"_{i}" for i in idx) for idx in np.ndindex(*shape)]


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1
