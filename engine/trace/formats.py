"""Trace tables as files: JSON, a zip of Parquet tables, or safetensors; the file suffix picks the format. Reading
checks the limits (limits.py) before the bulk of a file is parsed, and turns whatever a foreign or damaged file
causes into TraceFormatError naming the file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..spec.errors import InputError, MissingFileError
from .limits import MAX_FILE_BYTES, MAX_JSON_CONTAINERS, MAX_JSON_STRINGS, MAX_JSON_VALUES, MiB
from .parquet_zip import read_parquet_zip, write_parquet_zip
from .safetensors_file import read_safetensors, write_safetensors
from .tables import TraceFormatError

SUFFIXES = {".json": "json", ".parquet.zip": "parquet", ".zip": "parquet", ".safetensors": "safetensors"}


def trace_format(path: str | Path) -> str:
    name = str(path).lower()
    for suffix, fmt in SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise TraceFormatError(f"{path}: unknown trace format; use a name ending in .json, .parquet.zip or .safetensors")


def write_tables(tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any], path: str | Path,
                 fmt: str | None = None) -> Path:
    """Write build_tables output to `path` in `fmt` (default: from the suffix)."""
    path = Path(path)
    fmt = fmt or trace_format(path)
    if fmt == "json":
        body = {"header": header, "tables": {n: {c: v.tolist() for c, v in t.items()} for n, t in tables.items()}}
        path.write_text(json.dumps(body, ensure_ascii=False, allow_nan=True), encoding="utf-8")
    elif fmt == "parquet":
        path.write_bytes(write_parquet_zip(tables, header))
    elif fmt == "safetensors":
        path.write_bytes(write_safetensors(tables, header))
    else:
        raise InputError(f"unknown trace format {fmt!r}; choose json, parquet or safetensors")
    return path


def read_tables(path: str | Path) -> tuple[dict[str, dict[str, np.ndarray]], Any]:
    """(tables, header) from a file written by write_tables; a corrupt, foreign or oversized file raises
    TraceFormatError naming the file (never pickle). The header is checked later, by decode_tables."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such trace file")
    fmt = trace_format(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES[fmt]:
            raise TraceFormatError(f"{path}: {_too_large(fmt, size)}")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES[fmt] + 1)  # a file that grew since stat is still refused by size
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read the file ({e.strerror or e})") from None
    return read_tables_bytes(str(path), data)


def read_tables_bytes(name: str, data: bytes) -> tuple[dict[str, dict[str, np.ndarray]], Any]:
    """read_tables for a file's bytes (an upload); `name` picks the format and is named in errors."""
    fmt = trace_format(name)
    try:
        if not data:
            raise TraceFormatError("the file is empty")
        if len(data) > MAX_FILE_BYTES[fmt]:
            raise TraceFormatError(_too_large(fmt, len(data)))
        return {"json": _read_json, "parquet": read_parquet_zip, "safetensors": read_safetensors}[fmt](bytes(data))
    except TraceFormatError as e:
        raise TraceFormatError(f"{name}: {e}") from None
    except MemoryError:
        raise TraceFormatError(f"{name}: too large to read in the memory available") from None
    except Exception as e:  # a foreign file can fail inside zipfile, zlib, pyarrow or json in many ways
        raise TraceFormatError(f"{name}: not a readable {fmt} trace ({type(e).__name__}: {str(e)[:200]})") from None


def _too_large(fmt: str, size: int) -> str:
    return (f"the file has {size / MiB:,.1f} MiB; a {fmt} trace may have at most {MAX_FILE_BYTES[fmt] // MiB} MiB "
            "(the largest the app and CLI write is far smaller)")


# ---- JSON -------------------------------------------------------------------------------------

def _read_json(data: bytes) -> tuple[Any, Any]:
    _check_json_counts(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not UTF-8 text (byte {e.start:,}), so not a JSON trace") from None
    try:
        body = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise TraceFormatError("the JSON nests too deeply to be a trace (a trace nests 4 levels)") from None
    if not isinstance(body, dict) or "header" not in body or "tables" not in body:
        raise TraceFormatError("JSON lacks the 'header' and 'tables' of a v41viz trace")
    return body["tables"], body["header"]


def _check_json_counts(data: bytes) -> None:
    """Bound what json.loads would build, from the raw bytes: containers (brackets), strings (quote pairs) and
    values (commas + containers). Characters inside strings only over-count."""
    containers = data.count(b"[") + data.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        raise TraceFormatError(f"the JSON has {containers:,} opening brackets; a trace has at most "
                               f"{MAX_JSON_CONTAINERS:,} lists and objects")
    strings = data.count(b'"') // 2
    if strings > MAX_JSON_STRINGS:
        raise TraceFormatError(f"the JSON has {strings:,} strings; a trace has at most {MAX_JSON_STRINGS:,}")
    values = data.count(b",") + containers + 1
    if values > MAX_JSON_VALUES:
        raise TraceFormatError(f"the JSON has up to {values:,} values; a trace has at most {MAX_JSON_VALUES:,}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise TraceFormatError(f"the JSON names key '{twice}' twice in one object")
    return out
