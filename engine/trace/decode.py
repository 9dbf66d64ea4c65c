"""Trace tables back into records, validated: the header first (header.py), then each column's type, length and
values (finite numbers, lengths in range, unique keys); whatever a foreign or damaged file holds raises
TraceFormatError naming the table and column."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..spec.errors import InputError
from ..spec.limits import VOCAB_MAX
from .header import Layout, check_header, json_type
from .records import FACT_FIELDS, MHC_SITES, DSparkStep, TokenRecord, TraceBudget
from .tables import TABLES, VALUES, TraceFormatError, column_names

# Float fields that may hold a non-finite value (all others must be finite): a prompt token has no step time, a
# DSpark step may lack its time, and a top-k logit is -inf where the distribution masked a token.
NONFINITE_ALLOWED = {("tokens", "step_time_s"): "nan", ("dspark", "time_s"): "nan", ("tokens", "top_logits"): "-inf",
                     ("tokens", "logprob"): "nan", ("lens", "next_prob"): "nan"}
# Integer columns that count or index something, so never negative.
NON_NEGATIVE = {"row", "pos", "slot", "token_id", "expert", "anchor_pos", "anchor_token", "verify_len", "accepted",
                "next_token"}
# Columns that hold token ids: each id must lie below the recording model's vocabulary (the meta's vocab_size, which
# runs write since issue 46; for an older trace, the largest vocabulary a config may declare, spec/limits.py).
TOKEN_ID_FIELDS = {"tokens": ("token_id", "top_ids"), "dspark": ("anchor_token", "drafted", "next_token"),
                   "lens": ("top_ids", "next_id")}
INT64_MAX = np.iinfo(np.int64).max
PYTHON_TYPES = {"int64": {int}, "float32": {int, float}, "float64": {int, float}, "bool": {bool}, "str": {str}}
ARRAY_KINDS = {"int64": "iu", "float32": "iuf", "float64": "iuf", "bool": "b", "str": "OU"}
WORDS = {"int64": "integers", "float32": "numbers", "float64": "numbers", "bool": "true/false values",
         "str": "strings"}


@dataclass
class TraceContents:
    """Everything a trace holds, decoded from tables: what `Trace.from_tables` rebuilds a Trace from."""
    budget: TraceBudget
    meta: dict[str, Any]
    omitted: dict[str, int]
    facts: list[tuple[str, str, str, int, int, tuple[np.ndarray, ...]]]  # (kind, path, site, row, pos, values)
    tokens: list[TokenRecord]
    dspark_steps: list[DSparkStep]


def decode_tables(tables: Any, header: Any) -> TraceContents:
    """The records of build_tables output (after any file round trip); raises TraceFormatError."""
    try:
        layout = check_header(header)
    except TraceFormatError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
        raise TraceFormatError(f"the trace header is inconsistent ({type(e).__name__}: {e})") from None
    if not isinstance(tables, dict):
        raise TraceFormatError(f"the trace tables are {json_type(tables)}, not an object of tables")
    contents = TraceContents(layout.budget, layout.meta, layout.omitted, [], [], [])
    for name in TABLES:
        if name in layout.absent and not tables.get(name):   # an older trace, written before this table
            continue
        if name not in tables:
            raise TraceFormatError(f"table '{name}' is missing")
        try:
            _decode_table(contents, name, _columns(name, tables[name], layout), layout)
        except TraceFormatError:
            raise
        except InputError as e:  # a record's own check (DSparkStep)
            raise TraceFormatError(f"table '{name}': {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
            raise TraceFormatError(f"table '{name}' is inconsistent ({type(e).__name__}: {e})") from None
    return contents


# ---- columns ----------------------------------------------------------------------------------

def _columns(table: str, cols: Any, layout: Layout) -> dict[str, np.ndarray]:
    """The table's expected columns, each a checked 1-D array of its dtype and the declared length."""
    if not isinstance(cols, dict):
        raise TraceFormatError(f"table '{table}' is {json_type(cols)}, not an object of columns")
    expected = layout.columns[table]
    missing = [c for c in expected if c not in cols]
    if missing:
        raise TraceFormatError(f"table '{table}' lacks column{'s' * (len(missing) > 1)} {', '.join(missing[:5])}")
    extra = [str(c)[:60] for c in cols if c not in expected]
    if extra:
        raise TraceFormatError(f"table '{table}' has unexpected column{'s' * (len(extra) > 1)} "
                               f"{', '.join(extra[:5])}")
    return {c: _column(table, c, cols[c], dtype, layout.n_rows[table]) for c, dtype in expected.items()}


def _column(table: str, name: str, values: Any, dtype: str, n: int) -> np.ndarray:
    where = f"table '{table}' column '{name}'"
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise TraceFormatError(f"{where} has shape {values.shape}; a column is 1-D")
        kind_ok = values.dtype.kind in ARRAY_KINDS[dtype] or values.size == 0
        if kind_ok and values.dtype.kind == "O":
            kind_ok = set(map(type, values)) <= {str}
        if not kind_ok:
            raise TraceFormatError(f"{where} holds {values.dtype} values where {WORDS[dtype]} belong")
        if values.dtype.kind == "u" and values.size and values.max() > INT64_MAX:
            raise TraceFormatError(f"{where} holds integers beyond the 64-bit range")
    elif isinstance(values, list):
        types = set(map(type, values))
        if not types <= PYTHON_TYPES[dtype]:
            found = " and ".join(sorted(json_type(t()) for t in types - PYTHON_TYPES[dtype]))
            raise TraceFormatError(f"{where} holds {found} where {WORDS[dtype]} belong")
    else:
        raise TraceFormatError(f"{where} is {json_type(values)}, not a list of values")
    if len(values) != n:
        raise TraceFormatError(f"{where} has {len(values):,} rows; the header declares {n:,}")
    try:
        with np.errstate(over="ignore"):  # a float beyond float32 becomes inf, refused by _check_finite
            out = np.array(values, dtype=object if dtype == "str" else dtype).reshape(n)
    except OverflowError:
        raise TraceFormatError(f"{where} holds integers beyond the 64-bit range") from None
    if name in NON_NEGATIVE and n and out.min() < 0:
        raise TraceFormatError(f"{where} holds a negative value ({out.min()}); it counts or indexes")
    return out


def _check_finite(table: str, field: str, values: np.ndarray) -> None:
    if values.dtype.kind != "f" or not values.size:
        return
    bad = ~np.isfinite(values)
    allowed = NONFINITE_ALLOWED.get((table, field))
    if allowed == "nan":
        bad &= ~np.isnan(values)
    elif allowed == "-inf":
        bad &= ~np.isneginf(values)
    if bad.any():
        raise TraceFormatError(f"table '{table}' field '{field}' holds {int(bad.sum()):,} non-finite value(s) "
                               "(NaN or infinity) where a trace has finite numbers")


def _field_values(table: str, field: str, cols: dict, layout: Layout) -> list:
    """One value per row: a scalar, an array of the declared shape, or (ragged) a 1-D array of its length."""
    shape, ragged = layout.fields[table][field]
    n = layout.n_rows[table]
    if not shape:
        _check_finite(table, field, cols[field])
        return list(cols[field])
    names = column_names(field, shape)
    stacked = np.stack([cols[c] for c in names], axis=1) if names else \
        np.zeros((n, 0), VALUES[table][field])  # [N, prod(shape)]
    if not ragged:
        _check_finite(table, field, stacked)
        return list(stacked.reshape(n, *shape))  # [N, *shape]
    lengths = cols[f"{field}_len"]
    if n and lengths.max() > shape[0]:
        raise TraceFormatError(f"table '{table}' column '{field}_len' holds a length of {lengths.max()}, beyond "
                               f"the declared width {shape[0]}")
    _check_finite(table, field, stacked[np.arange(shape[0]) < lengths[:, None]])  # the cells before the padding
    return [stacked[i, : lengths[i]].copy() for i in range(n)]


# ---- records ----------------------------------------------------------------------------------

def vocabulary_bound(meta: dict[str, Any]) -> tuple[int, str]:
    """(the bound token ids stay below, what it is, for messages)."""
    size = meta.get("vocab_size")
    if type(size) is int and 0 < size <= VOCAB_MAX:
        return size, f"the vocabulary of {size:,} ids the header's meta declares"
    return VOCAB_MAX, f"{VOCAB_MAX:,}, the largest vocabulary a config may declare"


def _check_token_ids(name: str, cols: dict, layout: Layout) -> None:
    """Refuse a token id at or beyond the vocabulary (a foreign or damaged file: no model made it)."""
    bound, what = vocabulary_bound(layout.meta)
    for field in TOKEN_ID_FIELDS.get(name, ()):
        if field not in layout.fields[name]:
            continue
        shape = layout.fields[name][field][0]
        for column in column_names(field, shape) if shape else [field]:
            values = cols[column]
            if values.size and values.max() >= bound:
                raise TraceFormatError(f"table '{name}' column '{column}' holds token id {values.max():,}, outside "
                                       f"the vocabulary (ids below {what})")


def _decode_table(contents: TraceContents, name: str, cols: dict, layout: Layout) -> None:
    n = layout.n_rows[name]
    _check_token_ids(name, cols, layout)
    values = {f: _field_values(name, f, cols, layout) for f in layout.fields[name]}
    if name == "moe":
        facts = _decode_moe(cols, values, n)
    elif name in FACT_FIELDS:
        site = cols.get("site", np.full(n, "", dtype=object))
        if name == "mhc" and not set(site) <= set(MHC_SITES):
            raise TraceFormatError(f"table 'mhc' column 'site' holds {sorted(set(site) - set(MHC_SITES))[0]!r:.40}; "
                                   f"sites are {', '.join(MHC_SITES)}")
        facts = [(name, str(cols["path"][i]), str(site[i]), int(cols["row"][i]), int(cols["pos"][i]),
                  tuple(values[f][i] for f in FACT_FIELDS[name])) for i in range(n)]
    elif name == "tokens":
        _unique(name, zip(cols["row"].tolist(), cols["pos"].tolist()), "(row, pos)")
        for i in range(n):
            if not len(values["top_ids"][i]) == len(values["top_logits"][i]) == len(values["top_probs"][i]):
                raise TraceFormatError(f"table 'tokens' row {i}: top_ids, top_logits and top_probs differ in length")
        contents.tokens.extend(
            TokenRecord(int(cols["row"][i]), int(cols["pos"][i]), **{k: _plain(values[k][i]) for k in
                        ("token_id", "text", "generated", "step", "step_time_s")},
                        top_ids=values["top_ids"][i], top_logits=values["top_logits"][i],
                        top_probs=values["top_probs"][i],
                        logprob=float(values["logprob"][i]) if "logprob" in values else math.nan) for i in range(n))
        return
    else:
        _unique(name, zip(cols["row"].tolist(), cols["step"].tolist()), "(row, step)")
        for i in range(n):
            pairs = (("drafted", "draft_probs"), ("confidences", "survival"))
            if any(len(values[a][i]) != len(values[b][i]) for a, b in pairs):
                raise TraceFormatError(f"table 'dspark' row {i}: drafted and draft_probs, or confidences and "
                                       "survival, differ in length")
            try:
                contents.dspark_steps.append(DSparkStep(
                    row=int(cols["row"][i]), step=int(cols["step"][i]),
                    **{f: (values[f][i] if f in ("drafted", "draft_probs", "confidences", "survival")
                           else _plain(values[f][i])) for f in layout.fields["dspark"]}))
            except InputError as e:
                raise TraceFormatError(f"table 'dspark' row {i}: {e}") from None
        return
    if any(not p for _, p, *_ in facts):
        raise TraceFormatError(f"table '{name}' column 'path' holds an empty module path")
    _unique(name, ((p, s, r, q) for _, p, s, r, q, _ in facts), "(path, site, row, pos)")
    contents.facts.extend(facts)


def _decode_moe(cols: dict, values: dict, n: int) -> list[tuple]:
    """One moe fact per token from its k slot rows."""
    slot = cols["slot"]
    starts = np.flatnonzero(slot == 0)
    bounds = list(starts) + [n]
    if n and (not starts.size or starts[0] != 0):
        raise TraceFormatError("table 'moe': rows must come in groups whose slot runs 0, 1, ..., k-1")
    facts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        same = {(cols["path"][i], cols["row"][i], cols["pos"][i]) for i in range(a, b)}
        if len(same) != 1 or not np.array_equal(slot[a:b], np.arange(b - a)):
            raise TraceFormatError(f"table 'moe': rows {a}..{b - 1} do not form one token's slots 0..{b - a - 1}")
        ids = np.array(values["expert"][a:b], dtype=np.int64)
        weights = np.array(values["weight"][a:b], dtype=np.float32)
        scores = np.array(values["score"][a:b], dtype=np.float32)
        facts.append(("moe", str(cols["path"][a]), "", int(cols["row"][a]), int(cols["pos"][a]),
                      (ids, weights, scores, values["vision"][a])))
    return facts


def _unique(table: str, keys, what: str) -> None:
    seen = set()
    for key in keys:
        if key in seen:
            raise TraceFormatError(f"table '{table}' holds {what} {str(key)[:120]} twice")
        seen.add(key)


def _plain(v):
    """numpy scalar → Python scalar (the dataclasses hold Python ints, floats, bools and strs)."""
    return v.item() if isinstance(v, np.generic) else v
