"""Trace tables as files: JSON, a zip of Parquet tables, or safetensors; the file suffix picks the format."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..spec.errors import InputError, MissingFileError
from .tables import FORMAT, TABLES, TraceFormatError

SUFFIXES = {".json": "json", ".parquet.zip": "parquet", ".zip": "parquet", ".safetensors": "safetensors"}
HEADER_NAME = "trace.json"   # inside the Parquet zip
META_KEY = FORMAT            # key of the JSON header in the safetensors metadata


def trace_format(path: str | Path) -> str:
    name = str(path).lower()
    for suffix, fmt in SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise InputError(f"{path}: unknown trace format; use a name ending in .json, .parquet.zip or .safetensors")


def write_tables(tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any], path: str | Path,
                 fmt: str | None = None) -> Path:
    """Write build_tables output to `path` in `fmt` (default: from the suffix)."""
    path = Path(path)
    fmt = fmt or trace_format(path)
    if fmt == "json":
        body = {"header": header, "tables": {n: {c: v.tolist() for c, v in t.items()} for n, t in tables.items()}}
        path.write_text(json.dumps(body, ensure_ascii=False, allow_nan=True), encoding="utf-8")
    elif fmt == "parquet":
        _save_parquet(tables, header, path)
    elif fmt == "safetensors":
        _save_safetensors(tables, header, path)
    else:
        raise InputError(f"unknown trace format {fmt!r}; choose json, parquet or safetensors")
    return path


def read_tables(path: str | Path) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """(tables, header) from a file written by write_tables; a corrupt or foreign file raises
    TraceFormatError naming the file (never pickle)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such trace file")
    fmt = trace_format(path)
    try:
        if fmt == "json":
            return _load_json(path)
        if fmt == "parquet":
            return _load_parquet(path)
        return _load_safetensors(path)
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from None


# ---- JSON -------------------------------------------------------------------------------------

def _load_json(path: Path) -> tuple[dict, dict]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TraceFormatError("not a text file, so not a JSON trace") from None
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(body, dict) or "header" not in body or "tables" not in body:
        raise TraceFormatError("JSON lacks the 'header' and 'tables' of a v41viz trace")
    return body["tables"], body["header"]


# ---- Parquet (zip of one .parquet per table + trace.json) -------------------------------------

def _save_parquet(tables: dict, header: dict, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(HEADER_NAME, json.dumps(header, ensure_ascii=False, allow_nan=True))
        for name, cols in tables.items():
            arrow = pa.table({c: pa.array(v, type=pa.string()) if v.dtype == object else pa.array(v)
                              for c, v in cols.items()})
            buf = io.BytesIO()
            pq.write_table(arrow, buf)
            z.writestr(f"{name}.parquet", buf.getvalue())


def _load_parquet(path: Path) -> tuple[dict, dict]:
    import pyarrow.parquet as pq
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if HEADER_NAME not in names:
                raise TraceFormatError(f"zip has no {HEADER_NAME}, so it is not a v41viz trace")
            header = json.loads(z.read(HEADER_NAME).decode("utf-8"))
            tables = {}
            for name in TABLES:
                if f"{name}.parquet" not in names:
                    raise TraceFormatError(f"zip lacks {name}.parquet")
                table = pq.read_table(io.BytesIO(z.read(f"{name}.parquet")))
                tables[name] = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    except zipfile.BadZipFile:
        raise TraceFormatError("not a zip file (a Parquet trace is a .parquet.zip of tables)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{HEADER_NAME} is not valid JSON ({e})") from None
    except OSError as e:  # pyarrow reports a damaged Parquet body as ArrowInvalid (an OSError subclass)
        raise TraceFormatError(f"damaged Parquet table: {e}") from None
    return tables, header


# ---- safetensors (numeric columns as tensors; strings dictionary-encoded, header in metadata) --

def _save_safetensors(tables: dict, header: dict, path: Path) -> None:
    from safetensors.numpy import save_file
    tensors: dict[str, np.ndarray] = {}
    categories: dict[str, list[str]] = {}
    for name, cols in tables.items():
        for c, v in cols.items():
            key = f"{name}/{c}"
            if v.dtype == object:  # strings: int32 codes into a per-column category list
                cats, codes = np.unique(v.astype(str), return_inverse=True) if len(v) else (np.array([], str), v)
                categories[key] = cats.tolist()
                tensors[key] = np.asarray(codes, dtype=np.int32).reshape(len(v))
            else:
                tensors[key] = np.ascontiguousarray(v)
    meta = dict(header, categories=categories)
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta, ensure_ascii=False, allow_nan=True)})


def _load_safetensors(path: Path) -> tuple[dict, dict]:
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="np") as f:
            raw = (f.metadata() or {}).get(META_KEY)
            if raw is None:
                raise TraceFormatError("safetensors file has no v41viz trace header (is it a checkpoint?)")
            header: dict[str, Any] = json.loads(raw)
            categories = header.pop("categories", {})
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as e:
        raise TraceFormatError(f"not a readable safetensors file ({e})") from None
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"trace header is not valid JSON ({e})") from None
    tables: dict[str, dict[str, np.ndarray]] = {n: {} for n in TABLES}
    for key, arr in arrays.items():
        name, _, col = key.partition("/")
        if name not in tables:
            raise TraceFormatError(f"unexpected tensor '{key}'")
        if key in categories:
            cats = np.array(categories[key], dtype=object)
            if arr.size and (arr.min() < 0 or arr.max() >= len(cats)):
                raise TraceFormatError(f"string codes of '{key}' point outside its category list")
            arr = cats[arr] if len(cats) else np.array([], dtype=object)
        tables[name][col] = arr
    return tables, header

