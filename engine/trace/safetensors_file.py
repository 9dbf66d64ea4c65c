"""The safetensors trace format: numeric columns as 1-D tensors, strings as int32 codes into per-column category
lists, the header in the metadata. Read by parsing the safetensors header here, so its declared dtypes, shapes and
offsets are checked against the limits and the file before any tensor is copied."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from safetensors.numpy import save

from .limits import MAX_CELLS, MAX_COLUMNS, MAX_DECODED_BYTES, MAX_HEADER_BYTES, MAX_ROWS, MiB
from .tables import FORMAT, TABLES, TraceFormatError

META_KEY = FORMAT  # key of the JSON trace header in the safetensors metadata
DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
          "BOOL": np.dtype("u1")}  # what the writer produces: floats, ints, bools, and int32 string codes


def write_safetensors(tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any]) -> bytes:
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
    return save(tensors, metadata={META_KEY: json.dumps(meta, ensure_ascii=False, allow_nan=True)})


def read_safetensors(data: bytes) -> tuple[dict[str, dict[str, np.ndarray]], Any]:
    """(tables, header) of a safetensors trace's bytes; raises TraceFormatError."""
    declared, metadata, buffer = _parse_header(data)
    raw = metadata.get(META_KEY)
    if raw is None:
        raise TraceFormatError("safetensors file has no v41viz trace header (is it a checkpoint?)")
    entries = _entries(declared, len(buffer))
    header = _json(raw, "the trace header in the safetensors metadata")
    if not isinstance(header, dict):
        raise TraceFormatError("the trace header in the safetensors metadata is not a JSON object")
    categories = header.pop("categories", {})
    if not isinstance(categories, dict) or not all(
            isinstance(v, list) and all(type(s) is str for s in v) for v in categories.values()):
        raise TraceFormatError("the header's 'categories' must map tensor names to lists of strings")
    unknown = [k[:60] for k in categories if k not in entries]
    if unknown:
        raise TraceFormatError(f"the header has category lists for tensors the file lacks: {', '.join(unknown[:5])}")
    tables: dict[str, dict[str, np.ndarray]] = {n: {} for n in TABLES}
    for key, (dtype, length, start) in entries.items():
        name, _, col = key.partition("/")
        if name not in tables or not col:
            raise TraceFormatError(f"unexpected tensor '{key[:80]}' (trace tensors are named table/column with tables "
                                   f"{', '.join(TABLES)})")
        arr = np.frombuffer(buffer, dtype, length, start).copy()
        if dtype == DTYPES["BOOL"]:
            if arr.size and arr.max() > 1:
                raise TraceFormatError(f"bool tensor '{key}' holds bytes other than 0 and 1")
            arr = arr.astype(bool)
        if key in categories:
            arr = _decode_strings(key, arr, categories[key])
        tables[name][col] = arr
    return tables, header


def _parse_header(data: bytes) -> tuple[dict[str, Any], dict[str, str], memoryview]:
    """(tensor declarations, metadata, data buffer) of a safetensors file."""
    if len(data) < 8:
        raise TraceFormatError("not a safetensors file (shorter than its 8-byte header length)")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise TraceFormatError(f"not a readable safetensors trace: its header declares {n:,} bytes; a trace header "
                               f"has at most {MAX_HEADER_BYTES // MiB} MiB")
    if 8 + n > len(data):
        raise TraceFormatError(f"safetensors header of {n:,} bytes runs past the end of the {len(data):,}-byte file")
    header = _json(bytes(data[8:8 + n]), "safetensors header")
    if not isinstance(header, dict):
        raise TraceFormatError("safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(type(v) is str for v in metadata.values()):
        raise TraceFormatError("safetensors '__metadata__' must map names to strings")
    return header, metadata, memoryview(data)[8 + n:]


def _entries(header: dict[str, Any], size: int) -> dict[str, tuple[np.dtype, int, int]]:
    """Tensor name -> (dtype, length, offset), each declaration checked against the limits and the data size."""
    if len(header) > len(TABLES) * MAX_COLUMNS:
        raise TraceFormatError(f"safetensors header lists {len(header):,} tensors; a trace has at most "
                               f"{len(TABLES) * MAX_COLUMNS:,}")
    entries, cells, nbytes = {}, 0, 0
    for key, entry in header.items():
        dtype, length, start, end = _entry(key, entry, size)
        entries[key] = (dtype, length, start)
        cells, nbytes = cells + length, nbytes + end - start
    if cells > MAX_CELLS:
        raise TraceFormatError(f"the tensors declare {cells:,} cells; a trace holds at most {MAX_CELLS:,}")
    if nbytes > min(size, MAX_DECODED_BYTES):  # overlapping tensors would copy the same bytes again
        raise TraceFormatError(f"the tensors declare {nbytes:,} bytes, more than the file's {size:,} "
                               f"(or the limit of {MAX_DECODED_BYTES // MiB} MiB)")
    return entries


def _entry(key: str, entry: Any, size: int) -> tuple[np.dtype, int, int, int]:
    where = f"safetensors tensor '{key[:80]}'"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise TraceFormatError(f"{where} needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise TraceFormatError(f"{where} has dtype {dtype!r:.20}; trace tensors are {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and 0 <= shape[0] <= MAX_ROWS):
        raise TraceFormatError(f"{where} has shape {shape!r:.60}; a trace column is 1-D with at most "
                               f"{MAX_ROWS:,} rows")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= size):
        raise TraceFormatError(f"{where} has data_offsets {offsets!r:.60} outside the file's {size:,} data bytes")
    if offsets[1] - offsets[0] != shape[0] * DTYPES[dtype].itemsize:
        raise TraceFormatError(f"{where}: data_offsets span {offsets[1] - offsets[0]:,} bytes, but shape {shape} "
                               f"of {dtype} needs {shape[0] * DTYPES[dtype].itemsize:,}")
    return DTYPES[dtype], shape[0], offsets[0], offsets[1]


def _decode_strings(key: str, codes: np.ndarray, categories: list[str]) -> np.ndarray:
    if codes.dtype.kind not in "iu":
        raise TraceFormatError(f"string codes of '{key}' are {codes.dtype}, not integers")
    if codes.size and (codes.min() < 0 or codes.max() >= len(categories)):
        raise TraceFormatError(f"string codes of '{key}' point outside its category list of {len(categories)}")
    return np.array(categories, dtype=object)[codes] if codes.size else np.array([], dtype=object)


def _json(raw: str | bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TraceFormatError(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None
