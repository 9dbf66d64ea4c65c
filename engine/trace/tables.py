"""A Trace's contents as flat columnar tables (one 1-D column each, pandas-ready) and back, exactly."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..spec.errors import InputError
from .records import FACT_FIELDS, DSparkStep, TokenRecord, TraceBudget

FORMAT = "v41viz-trace"
VERSION = 1
TABLES = ("moe", "mhc", "engram", "attention", "tokens", "dspark")

# Key columns (1-D, always present) and value fields with their dtypes, per table.
KEYS: dict[str, dict[str, str]] = {
    "moe": {"path": "str", "row": "int64", "pos": "int64", "slot": "int64"},
    "mhc": {"path": "str", "site": "str", "row": "int64", "pos": "int64"},
    "engram": {"path": "str", "row": "int64", "pos": "int64"},
    "attention": {"path": "str", "row": "int64", "pos": "int64"},
    "tokens": {"row": "int64", "pos": "int64"},
    "dspark": {"row": "int64", "step": "int64"},
}
VALUES: dict[str, dict[str, str]] = {
    "moe": {"expert": "int64", "weight": "float32", "score": "float32", "vision": "bool"},
    "mhc": dict.fromkeys(FACT_FIELDS["mhc"], "float32"),
    "engram": {"compressed_ids": "int64", "row_ids": "int64", "gates": "float32"},
    "attention": {"topk": "int64", "window_mass": "float32", "compressed_mass": "float32", "sink_mass": "float32"},
    "tokens": {"token_id": "int64", "text": "str", "generated": "bool", "step": "int64", "step_time_s": "float64",
               "top_ids": "int64", "top_logits": "float32", "top_probs": "float32"},
    "dspark": {"anchor_pos": "int64", "anchor_token": "int64", "drafted": "int64", "draft_probs": "float32",
               "confidences": "float32", "survival": "float32", "verify_len": "int64", "accepted": "int64",
               "next_token": "int64", "next_kind": "str", "time_s": "float64"},
}
PAD = {"int64": -1, "float32": np.nan, "float64": np.nan, "bool": False}


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


@dataclass
class TraceContents:
    """Everything a trace holds, decoded from tables: what `Trace.from_tables` rebuilds a Trace from."""
    budget: TraceBudget
    meta: dict[str, Any]
    omitted: dict[str, int]
    facts: list[tuple[str, str, str, int, int, tuple[np.ndarray, ...]]]  # (kind, path, site, row, pos, values)
    tokens: list[TokenRecord]
    dspark_steps: list[DSparkStep]


def build_tables(trace: TraceReader, only: str | None = None) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """(tables, header): tables[name][column] are 1-D arrays; header holds budget, meta, omitted and shapes."""
    names = TABLES if only is None else (only,)
    if only is not None and only not in TABLES:
        raise KeyError(f"unknown trace table {only!r}; tables are {', '.join(TABLES)}")
    tables, schema = {}, {}
    for name in names:
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


def decode_tables(tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any]) -> TraceContents:
    """The records of build_tables output (after any file round trip); raises TraceFormatError."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceFormatError(f"not a {FORMAT} file (header format is {header.get('format') if isinstance(header, dict) else header!r})")
    if header.get("version") != VERSION:
        raise TraceFormatError(f"trace version {header.get('version')!r} is not supported (this engine reads {VERSION})")
    try:
        contents = TraceContents(TraceBudget.from_dict(header["budget"]), header["meta"],
                                 {k: int(v) for k, v in header["omitted"].items()}, [], [], [])
        for name in TABLES:
            cols = tables.get(name)
            if cols is None:
                raise TraceFormatError(f"table '{name}' is missing")
            _decode_table(contents, name, cols, header["schema"][name], int(header["n_rows"][name]))
    except (KeyError, TypeError, IndexError) as e:
        raise TraceFormatError(f"trace is incomplete or inconsistent: {type(e).__name__}: {e}") from None
    return contents


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
        names = _names(field, shape)
        return {n: np.ascontiguousarray(stacked[:, i]) for i, n in enumerate(names)}, {"shape": list(shape)}
    if any(len(s) != 1 for s in shapes):
        raise InputError(f"trace table {table}: field '{field}' has varying shapes {sorted(shapes)}; "
                         "only 1-D fields may vary in length")
    width = max(s[0] for s in shapes)
    padded = np.full((len(arrays), width), PAD[dtype], dtype=dtype)
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    for i, a in enumerate(arrays):
        padded[i, : a.shape[0]] = a
    cols = {n: np.ascontiguousarray(padded[:, i]) for i, n in enumerate(_names(field, (width,)))}
    cols[f"{field}_len"] = lengths
    return cols, {"shape": [width], "ragged": True}


def _names(field: str, shape: tuple[int, ...]) -> list[str]:
    return [field + "".join(f"_{i}" for i in idx) for idx in np.ndindex(*shape)]


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


# ---- decoding ---------------------------------------------------------------------------------

def _get(cols: dict, table: str, name: str, dtype: str, n: int) -> np.ndarray:
    if name not in cols:
        raise TraceFormatError(f"table '{table}' lacks column '{name}'")
    values = cols[name]
    arr = np.array(list(values) if dtype == "str" else values, dtype=object if dtype == "str" else dtype)
    if arr.shape != (n,):
        raise TraceFormatError(f"table '{table}' column '{name}' has {arr.shape[0] if arr.ndim else 0} rows, expected {n}")
    return arr


def _field_values(cols: dict, table: str, field: str, dtype: str, spec: dict, n: int) -> list:
    shape = tuple(spec["shape"])
    if not shape:
        return list(_get(cols, table, field, dtype, n))
    names = _names(field, shape)
    stacked = np.stack([_get(cols, table, c, dtype, n) for c in names], axis=1) if n and names else \
        np.zeros((n, len(names)), dtype)
    stacked = stacked.reshape(n, *shape)  # [N, *shape]
    if spec.get("ragged"):
        lengths = _get(cols, table, f"{field}_len", "int64", n)
        return [stacked[i, : lengths[i]].copy() for i in range(n)]
    return list(stacked)


def _decode_table(contents: TraceContents, name: str, cols: dict, schema: dict, n: int) -> None:
    keys = {k: _get(cols, name, k, dt, n) for k, dt in KEYS[name].items()}
    values = {f: _field_values(cols, name, f, dt, schema[f], n) for f, dt in VALUES[name].items()}
    if name == "moe":
        contents.facts.extend(_decode_moe(keys, values, n))
    elif name in FACT_FIELDS:
        site = keys.get("site", [""] * n)
        contents.facts.extend((name, str(keys["path"][i]), str(site[i]), int(keys["row"][i]), int(keys["pos"][i]),
                               tuple(values[f][i] for f in FACT_FIELDS[name])) for i in range(n))
    elif name == "tokens":
        contents.tokens.extend(
            TokenRecord(**{k: _plain(values[k][i] if k in values else keys[k][i]) for k in
                           ("row", "pos", "token_id", "text", "generated", "step", "step_time_s")},
                        top_ids=values["top_ids"][i], top_logits=values["top_logits"][i],
                        top_probs=values["top_probs"][i]) for i in range(n))
    else:
        contents.dspark_steps.extend(DSparkStep(
            row=int(keys["row"][i]), step=int(keys["step"][i]),
            **{f: (values[f][i] if f in ("drafted", "draft_probs", "confidences", "survival")
                   else _plain(values[f][i])) for f in VALUES["dspark"]}) for i in range(n))


def _decode_moe(keys: dict, values: dict, n: int) -> list[tuple]:
    """One moe fact per token from its k slot rows."""
    slot = keys["slot"]
    starts = np.flatnonzero(slot == 0)
    bounds = list(starts) + [n]
    if n and (not starts.size or starts[0] != 0):
        raise TraceFormatError("table 'moe': rows must come in groups whose slot runs 0, 1, ..., k-1")
    facts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        same = {(keys["path"][i], keys["row"][i], keys["pos"][i]) for i in range(a, b)}
        if len(same) != 1 or not np.array_equal(slot[a:b], np.arange(b - a)):
            raise TraceFormatError(f"table 'moe': rows {a}..{b - 1} do not form one token's slots 0..{b - a - 1}")
        ids = np.array(values["expert"][a:b], dtype=np.int64)
        weights = np.array(values["weight"][a:b], dtype=np.float32)
        scores = np.array(values["score"][a:b], dtype=np.float32)
        facts.append(("moe", str(keys["path"][a]), "", int(keys["row"][a]), int(keys["pos"][a]),
                      (ids, weights, scores, values["vision"][a])))
    return facts


def _plain(v):
    """numpy scalar → Python scalar (the dataclasses hold Python ints, floats, bools and strs)."""
    return v.item() if isinstance(v, np.generic) else v
