"""The Parquet trace format: a zip of one .parquet per table plus trace.json (the header), written stored; read
with the zip directory's and each table's declared sizes checked against the limits before anything is extracted
or decoded."""
from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from .limits import (
    MAX_CELLS,
    MAX_COLUMNS,
    MAX_DECODED_BYTES,
    MAX_HEADER_BYTES,
    MAX_ROWS,
    MAX_ZIP_BYTES,
    MAX_ZIP_MEMBERS,
    MAX_ZIP_RATIO,
    RATIO_FLOOR_BYTES,
    MiB,
)
from .tables import OPTIONAL_TABLES, TABLES, TraceFormatError

HEADER_NAME = "trace.json"
MEMBERS = (HEADER_NAME, *(f"{name}.parquet" for name in TABLES))
END_OF_DIRECTORY = b"PK\x05\x06"
PARQUET_CODECS = ("UNCOMPRESSED", "SNAPPY")  # what pyarrow and pandas write by default; no high-ratio codecs


def write_parquet_zip(tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any]) -> bytes:
    # pyarrow takes about 0.3 s to import: only Parquet writes and reads load it
    import pyarrow as pa
    import pyarrow.parquet as pq
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(HEADER_NAME, json.dumps(header, ensure_ascii=False, allow_nan=True))
        for name, cols in tables.items():
            arrow = pa.table({c: pa.array(v, type=pa.string()) if v.dtype == object else pa.array(v)
                              for c, v in cols.items()})
            buf = io.BytesIO()
            pq.write_table(arrow, buf)
            z.writestr(f"{name}.parquet", buf.getvalue())
    return out.getvalue()


def read_parquet_zip(data: bytes) -> tuple[dict[str, dict[str, np.ndarray]], Any]:
    """(tables, header) of a Parquet zip's bytes; raises TraceFormatError."""
    _check_directory_size(data)
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise TraceFormatError(f"not a zip file (a Parquet trace is a .parquet.zip of tables): {e}") from None
    with z:
        infos = _check_members(z.infolist())
        header_bytes = _read_member(z, infos[HEADER_NAME])
        members = {name: _read_member(z, infos[f"{name}.parquet"]) for name in TABLES if f"{name}.parquet" in infos}
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TraceFormatError(f"{HEADER_NAME} is not valid JSON ({type(e).__name__}: {e})") from None
    files = {name: _open_table(name, raw) for name, raw in members.items()}
    _check_declared_sizes(files)
    return {name: _read_table(name, f) for name, f in files.items()}, header


# ---- the zip ----------------------------------------------------------------------------------

def _check_directory_size(data: bytes) -> None:
    """Count the zip's entries from its end-of-directory record before zipfile reads the whole directory."""
    at = data.rfind(END_OF_DIRECTORY, max(0, len(data) - 22 - 65535))
    if at < 0 or len(data) < at + 22:
        raise TraceFormatError("not a zip file (a Parquet trace is a .parquet.zip of tables)")
    _, _, _, entries, directory_bytes, _, _ = struct.unpack("<4H2LH", data[at + 4: at + 22])
    if entries > MAX_ZIP_MEMBERS:  # 0xFFFF (zip64) counts as too many as well
        raise TraceFormatError(f"the zip has {entries:,} members; a trace zip has at most {MAX_ZIP_MEMBERS}")
    if directory_bytes > MAX_ZIP_MEMBERS * (46 + 65535 * 3):
        raise TraceFormatError(f"the zip's directory declares {directory_bytes:,} bytes, too large for a trace")


def _check_members(infos: list[zipfile.ZipInfo]) -> dict[str, zipfile.ZipInfo]:
    """The expected members, after checking names, methods, declared sizes and ratios (nothing extracted yet)."""
    if len(infos) > MAX_ZIP_MEMBERS:
        raise TraceFormatError(f"the zip has {len(infos):,} members; a trace zip has at most {MAX_ZIP_MEMBERS}")
    by_name: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        if info.filename in by_name:
            raise TraceFormatError(f"the zip holds member '{info.filename[:80]}' twice")
        by_name[info.filename] = info
    for info in infos:
        name = f"zip member '{info.filename[:80]}'"
        if info.flag_bits & 0x1:
            raise TraceFormatError(f"{name} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise TraceFormatError(f"{name} uses compression method {info.compress_type}; a trace zip's members "
                                   "are stored or deflated")
        if info.file_size > RATIO_FLOOR_BYTES and info.file_size > MAX_ZIP_RATIO * max(info.compress_size, 1):
            raise TraceFormatError(f"{name} expands {info.file_size / max(info.compress_size, 1):,.0f} times "
                                   f"({info.compress_size:,} to {info.file_size:,} bytes); the limit is "
                                   f"{MAX_ZIP_RATIO} (a zip bomb?)")
    if HEADER_NAME not in by_name:
        raise TraceFormatError(f"zip has no {HEADER_NAME}, so it is not a v41viz trace")
    optional = {f"{name}.parquet" for name in OPTIONAL_TABLES}   # an older trace lacks them
    missing = [m for m in MEMBERS if m not in by_name and m not in optional]
    if missing:
        raise TraceFormatError(f"zip lacks {', '.join(missing)}")
    extra = [m[:60] for m in by_name if m not in MEMBERS]
    if extra:
        raise TraceFormatError(f"zip holds unexpected member{'s' * (len(extra) > 1)} {', '.join(extra[:5])}")
    if by_name[HEADER_NAME].file_size > MAX_HEADER_BYTES:
        raise TraceFormatError(f"{HEADER_NAME} declares {by_name[HEADER_NAME].file_size:,} bytes; a trace header "
                               f"has at most {MAX_HEADER_BYTES // MiB} MiB")
    total = sum(info.file_size for info in infos)
    if total > MAX_ZIP_BYTES:
        raise TraceFormatError(f"the zip's members declare {total / MiB:,.1f} MiB uncompressed; a trace zip holds "
                               f"at most {MAX_ZIP_BYTES // MiB} MiB")
    return by_name


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, never more than its declared size (zipfile also checks its CRC)."""
    try:
        with z.open(info) as f:
            data = f.read(info.file_size + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise TraceFormatError(f"zip member '{info.filename}' is damaged ({e})") from None
    if len(data) != info.file_size:
        raise TraceFormatError(f"zip member '{info.filename}' holds {len(data):,} bytes, not the {info.file_size:,} "
                               "its directory entry declares")
    return data


# ---- the tables -------------------------------------------------------------------------------

def _open_table(name: str, raw: bytes):
    """The table's ParquetFile (only its footer parsed), its columns checked to be flat numbers, bools or text."""
    # pyarrow takes about 0.3 s to import: only Parquet writes and reads load it
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        # the footer's lists (row groups, columns, metadata entries) and strings bounded while it is parsed
        f = pq.ParquetFile(pa.BufferReader(raw), thrift_container_size_limit=4 * MAX_COLUMNS,
                           thrift_string_size_limit=MAX_HEADER_BYTES)
        schema = f.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise TraceFormatError(f"{name}.parquet is not a readable Parquet table ({str(e)[:160]})") from None
    if len(schema) > MAX_COLUMNS:
        raise TraceFormatError(f"{name}.parquet has {len(schema):,} columns; a table has at most {MAX_COLUMNS:,}")
    if len(set(schema.names)) != len(schema.names):
        raise TraceFormatError(f"{name}.parquet names a column twice")
    for field in schema:
        t = field.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise TraceFormatError(f"{name}.parquet column '{field.name}' has type {t}; trace columns hold "
                                   "numbers, booleans or text")
    return f


def _check_declared_sizes(files: dict) -> None:
    """Rows, cells, codecs and uncompressed bytes as the Parquet footers declare them, against the limits."""
    rows = cells = decoded = 0
    for name, f in files.items():
        md = f.metadata
        rows += md.num_rows
        cells += md.num_rows * md.num_columns
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.compression not in PARQUET_CODECS:
                    raise TraceFormatError(f"{name}.parquet is compressed with {chunk.compression}; a trace's tables "
                                           f"use {' or '.join(PARQUET_CODECS)}")
                decoded += max(chunk.total_uncompressed_size, 0)
    if rows > MAX_ROWS:
        raise TraceFormatError(f"the tables declare {rows:,} rows; a trace holds at most {MAX_ROWS:,}")
    if cells > MAX_CELLS:
        raise TraceFormatError(f"the tables declare {cells:,} cells (rows x columns); a trace holds at most "
                               f"{MAX_CELLS:,}")
    if decoded > MAX_DECODED_BYTES:
        raise TraceFormatError(f"the tables declare {decoded / MiB:,.1f} MiB uncompressed; a trace holds at most "
                               f"{MAX_DECODED_BYTES // MiB} MiB")


def _read_table(name: str, f) -> dict[str, np.ndarray]:
    # pyarrow takes about 0.3 s to import: only Parquet writes and reads load it
    import pyarrow as pa
    try:
        table = f.read()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise TraceFormatError(f"{name}.parquet is damaged ({str(e)[:160]})") from None
    if table.num_rows != f.metadata.num_rows:
        raise TraceFormatError(f"{name}.parquet holds {table.num_rows:,} rows, not the {f.metadata.num_rows:,} "
                               "its footer declares")
    out = {}
    for c in table.column_names:
        column = table.column(c)
        if column.null_count:
            raise TraceFormatError(f"{name}.parquet column '{c}' has {column.null_count:,} missing values")
        out[c] = column.to_numpy(zero_copy_only=False)
    return out
