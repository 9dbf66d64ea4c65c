"""Property-based tests (hypothesis) of the trace header and tables reader (issue 46): a real header with entries
replaced by any JSON value, or any JSON at all, is read as a trace or refused with a TraceFormatError — never
another exception — in bounded time."""
from __future__ import annotations

import copy
import json
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.trace import Trace, TraceBudget, TraceFormatError, load_trace_bytes
from engine.trace.header import check_header
from engine.trace.records import TokenRecord

PROPERTY = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CASE_MAX_S = 2.0


def small_trace() -> Trace:
    """Three tokens of one row with top-2 logits, written by hand (no model)."""
    trace = Trace(TraceBudget(top_k_logits=2), meta={"config": "tiny-v4.1", "vocab_size": 512})
    for pos, token in enumerate((0, 17, 42)):
        trace._tokens.setdefault(0, {})[pos] = TokenRecord(
            0, pos, token, f"t{token}", pos > 0, pos - 1, 0.01 if pos else float("nan"),
            top_ids=np.array([token, 3]), top_logits=np.array([2.0, 1.0], np.float32),
            top_probs=np.array([0.7, 0.3], np.float32), logprob=-0.3 if pos else float("nan"))
    return trace


TABLES, HEADER = small_trace().to_tables()
BODY = {"header": HEADER, "tables": {t: {c: v.tolist() for c, v in cols.items()} for t, cols in TABLES.items()}}

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)


def paths(value, prefix=()):
    """Every path (tuple of keys and indexes) into a JSON value, the value's own first."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            yield from paths(v, (*prefix, i))


HEADER_PATHS = [p for p in paths(HEADER) if p]
TABLE_PATHS = [("tables", *p) for p in paths(BODY["tables"]) if p]


def replaced(body: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(body)
    where = out
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return out


def read(body) -> None:
    start = time.perf_counter()
    try:
        load_trace_bytes("t.json", json.dumps(body).encode())
    except TraceFormatError as e:
        assert str(e).startswith("t.json: ") and len(str(e)) <= 800, str(e)[:1000]
    assert time.perf_counter() - start < CASE_MAX_S


def test_the_hand_written_trace_loads():
    assert load_trace_bytes("t.json", json.dumps(BODY).encode()).tokens(0)[2].token_id == 42
    assert check_header(HEADER).n_rows["tokens"] == 3


@PROPERTY
@given(st.sampled_from(HEADER_PATHS), json_values)
def test_a_header_entry_replaced_by_any_json_is_read_or_refused(path, value):
    read(replaced(BODY, ("header", *path), value))


@PROPERTY
@given(st.sampled_from(TABLE_PATHS), json_values)
def test_a_table_entry_replaced_by_any_json_is_read_or_refused(path, value):
    read(replaced(BODY, path, value))


@PROPERTY
@given(json_values, json_values)
def test_any_header_and_tables_are_read_or_refused(header, tables):
    read({"header": header, "tables": tables})
