"""The trace header, checked before any table is read: format, version, budget, meta, omitted counts, and the
declared table shapes (rows per table, values per field) against the limits."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..spec.errors import InputError
from .limits import MAX_CELLS, MAX_COLUMNS, MAX_ROWS
from .records import FACT_KINDS, TraceBudget
from .tables import (
    FORMAT,
    KEYS,
    OPTIONAL_FIELDS,
    OPTIONAL_TABLES,
    TABLES,
    VALUES,
    VERSION,
    TraceFormatError,
    column_names,
)

MAX_FIELD_DIMS = 4  # the recorded fields have at most 2 dimensions (mHC's comb is [hc, hc])
MAX_META_DEPTH = 4  # generation settings are flat; deeper nesting would only burden whoever prints the meta
BUDGET_KEYS = ("max_tokens", "layers", "attention", "top_k_logits", "lens")
OPTIONAL_BUDGET_KEYS = {"lens": False}  # budget keys added after traces were first written, with their old value


@dataclass(frozen=True)
class Layout:
    """What a checked header declares: the budget, meta and omitted counts, and per table its rows, its
    fields' shapes (shape, ragged) and the columns (name -> dtype) those imply."""
    budget: TraceBudget
    meta: dict[str, Any]
    omitted: dict[str, int]
    n_rows: dict[str, int]
    fields: dict[str, dict[str, tuple[tuple[int, ...], bool]]]
    columns: dict[str, dict[str, str]]
    absent: tuple[str, ...] = ()   # optional tables an older trace does not have (read as empty)


def check_header(header: Any) -> Layout:
    """The header's Layout; raises TraceFormatError naming the first wrong header field."""
    if not isinstance(header, dict):
        raise TraceFormatError(f"the trace header is {json_type(header)}, not an object")
    if header.get("format") != FORMAT:
        raise TraceFormatError(f"not a {FORMAT} file (header format is {header.get('format')!r:.60})")
    version = header.get("version")
    if type(version) is not int or version != VERSION:
        raise TraceFormatError(f"trace version {version!r:.40} is not supported (this engine reads {VERSION})")
    budget = _budget(_entry(header, "budget", dict))
    meta = _entry(header, "meta", dict)
    if not all(isinstance(k, str) for k in meta):
        raise TraceFormatError("header 'meta' has keys that are not strings")
    if not _shallow(meta, MAX_META_DEPTH):
        raise TraceFormatError(f"header 'meta' nests lists and objects deeper than {MAX_META_DEPTH} levels")
    omitted = _entry(header, "omitted", dict)
    for kind, count in omitted.items():
        if kind not in FACT_KINDS or not _count(count):
            raise TraceFormatError(f"header 'omitted' must map fact kinds ({', '.join(FACT_KINDS)}) to "
                                   f"non-negative integers, got {kind!r:.40}: {count!r:.40}")
    schema, n_rows = _entry(header, "schema", dict), _entry(header, "n_rows", dict)
    absent = [t for t in OPTIONAL_TABLES if t not in schema and t not in n_rows]  # an older trace's
    present = tuple(t for t in TABLES if t not in absent)
    _same_keys("header 'schema'", schema, present)
    _same_keys("header 'n_rows'", n_rows, present)
    fields, columns = {t: {} for t in absent}, {t: {} for t in absent}
    n_rows = {**dict.fromkeys(absent, 0), **n_rows}
    for table in present:
        fields[table], columns[table] = _table_layout(table, schema)
        if not _count(n_rows[table]):
            raise TraceFormatError(f"header 'n_rows' of table '{table}' must be a non-negative integer, "
                                   f"got {n_rows[table]!r:.40}")
    rows = sum(n_rows[t] for t in TABLES)
    if rows > MAX_ROWS:
        raise TraceFormatError(f"the header declares {rows:,} table rows; a trace may hold at most {MAX_ROWS:,}")
    cells = sum(n_rows[t] * len(columns[t]) for t in TABLES)
    if cells > MAX_CELLS:
        raise TraceFormatError(f"the header declares {cells:,} table cells (rows x columns); a trace may hold at "
                               f"most {MAX_CELLS:,}")
    return Layout(budget, meta, dict(omitted), {t: n_rows[t] for t in TABLES}, fields, columns, tuple(absent))


def json_type(value: Any) -> str:
    """A value's JSON type in words ('a list', 'a string', ...), for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def _entry(header: dict, key: str, kind: type) -> Any:
    if key not in header:
        raise TraceFormatError(f"the trace header lacks '{key}'")
    value = header[key]
    if not isinstance(value, kind):
        raise TraceFormatError(f"header '{key}' is {json_type(value)}, expected {json_type(kind())}")
    return value


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _same_keys(where: str, d: dict, expected) -> None:
    missing = [k for k in expected if k not in d]
    extra = [str(k)[:60] for k in d if k not in expected]
    if missing or extra:
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                ([f"has unknown {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"] if extra else [])
        raise TraceFormatError(f"{where} {' and '.join(parts)} (expected {', '.join(expected)})")


def _budget(d: dict) -> TraceBudget:
    d = {**OPTIONAL_BUDGET_KEYS, **d}
    _same_keys("header 'budget'", d, BUDGET_KEYS)
    max_tokens, layers, attention, top_k, lens = (d[k] for k in BUDGET_KEYS)
    if max_tokens is not None and not _count(max_tokens):
        raise TraceFormatError("header budget 'max_tokens' must be a non-negative integer or null, "
                               f"got {max_tokens!r:.40}")
    if not _count(top_k):
        raise TraceFormatError(f"header budget 'top_k_logits' must be a non-negative integer, got {top_k!r:.40}")
    if not isinstance(lens, bool):
        raise TraceFormatError(f"header budget 'lens' must be true/false, got {json_type(lens)}")
    for name, value in (("layers", layers), ("attention", attention)):
        allowed = value is None if name == "layers" else isinstance(value, bool)
        if not allowed and not (isinstance(value, list) and all(type(x) in (int, str) for x in value)):
            raise TraceFormatError(f"header budget '{name}' must be {'null' if name == 'layers' else 'true/false'} "
                                   f"or a list of layer numbers and paths, got {json_type(value)}")
    try:
        return TraceBudget(max_tokens=max_tokens, layers=layers,
                           attention=attention if isinstance(attention, bool) else frozenset(attention),
                           top_k_logits=top_k, lens=lens)
    except InputError as e:
        raise TraceFormatError(f"header 'budget': {e}") from None


def _shallow(value: Any, levels: int) -> bool:
    """Whether lists and objects nest at most `levels` deep in value (recursion bounded by `levels`)."""
    if not isinstance(value, (dict, list)):
        return True
    items = value.values() if isinstance(value, dict) else value
    return levels > 0 and all(_shallow(v, levels - 1) for v in items)


def _table_layout(table: str, schema: dict) -> tuple[dict, dict[str, str]]:
    """(field -> (shape, ragged), column -> dtype) of one table, from its schema entry."""
    specs = schema.get(table)
    if not isinstance(specs, dict):
        raise TraceFormatError(f"header 'schema' of table '{table}' is {json_type(specs)}, expected an object")
    present = {f: d for f, d in VALUES[table].items() if f in specs or (table, f) not in OPTIONAL_FIELDS}
    _same_keys(f"header 'schema' of table '{table}'", specs, tuple(present))
    fields, columns = {}, dict(KEYS[table])
    for field, dtype in present.items():
        shape, ragged = _field_spec(table, field, dtype, specs[field])
        fields[field] = (shape, ragged)
        columns.update(dict.fromkeys(column_names(field, shape) if shape else [field], dtype))
        if ragged:
            columns[f"{field}_len"] = "int64"
    if len(columns) > MAX_COLUMNS:
        raise TraceFormatError(f"header 'schema' declares {len(columns):,} columns for table '{table}'; "
                               f"the limit is {MAX_COLUMNS:,}")
    return fields, columns


def _field_spec(table: str, field: str, dtype: str, spec: Any) -> tuple[tuple[int, ...], bool]:
    where = f"header 'schema' of {table}.{field}"
    if not isinstance(spec, dict) or not set(spec) <= {"shape", "ragged"} or "shape" not in spec:
        raise TraceFormatError(f"{where} must be an object with 'shape' (and optionally 'ragged'), got {spec!r:.80}")
    shape, ragged = spec["shape"], spec.get("ragged", False)
    if not isinstance(shape, list) or len(shape) > MAX_FIELD_DIMS or not all(_count(d) for d in shape):
        raise TraceFormatError(f"{where}: 'shape' must be a list of at most {MAX_FIELD_DIMS} non-negative "
                               f"integers, got {shape!r:.80}")
    if math.prod(shape) > MAX_COLUMNS:
        raise TraceFormatError(f"{where} declares shape {shape} ({math.prod(shape):,} values per row); "
                               f"the limit is {MAX_COLUMNS:,}")
    if not isinstance(ragged, bool) or (ragged and len(shape) != 1):
        raise TraceFormatError(f"{where}: 'ragged' must be true/false, and true only for a 1-D shape")
    if dtype == "str" and shape:
        raise TraceFormatError(f"{where}: a text field has no shape, got {shape}")
    return tuple(shape), ragged
