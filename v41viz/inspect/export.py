"""Trace export and upload: bytes in each file format for a download button, and a Trace from uploaded bytes."""
from __future__ import annotations

import tempfile
from pathlib import Path

from engine.spec.errors import InputError
from engine.trace import Trace, TraceFormatError, load_trace, save_trace, trace_format

FORMATS = {"json": ("trace.json", "application/json"),
           "parquet": ("trace.parquet.zip", "application/zip"),
           "safetensors": ("trace.safetensors", "application/octet-stream")}


def trace_bytes(trace: Trace, fmt: str) -> bytes:
    """The trace as a file of the format (json | parquet | safetensors), through the engine's writer."""
    if fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / FORMATS[fmt][0]
        save_trace(trace, path)
        return path.read_bytes()


def trace_from_upload(name: str, data: bytes) -> Trace:
    """Read an uploaded trace; the name's suffix picks the format. Raises ValueError / TraceFormatError with
    a message for the page."""
    trace_format(name)  # refuses an unknown suffix with a message naming the accepted ones
    if not data:
        raise TraceFormatError(f"{name}: the file is empty")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / Path(name).name
        path.write_bytes(data)
        try:
            return load_trace(path)
        except TraceFormatError as e:
            raise TraceFormatError(str(e).replace(str(path), name)) from None
        except Exception as e:  # a foreign zip/safetensors can fail inside pyarrow or safetensors
            raise TraceFormatError(f"{name}: not a readable v41viz trace ({type(e).__name__}: {e})") from None
