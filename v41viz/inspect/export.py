"""Trace export and upload: bytes in each file format for a download button, and a Trace from uploaded bytes."""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from engine.spec.errors import InputError
from engine.trace import Trace, TraceFormatError, load_trace_bytes, save_trace, trace_format
from engine.trace.limits import MAX_FILE_BYTES, MiB

FORMATS = {"json": ("trace.json", "application/json"),
           "parquet": ("trace.parquet.zip", "application/zip"),
           "safetensors": ("trace.safetensors", "application/octet-stream")}
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")   # what may not stand in a file name on any system (and spaces)
RUNS = re.compile(r"[-.]{2,}")             # '..' and '-.-' left where unsafe characters were


def download_name(model: str, prompt: str, when: float, fmt: str) -> str:
    """'<model>_<prompt words>_<UTC time><suffix>': traces saved one after another no longer all land as trace.json,
    and the name says which model and prompt made them. Only [A-Za-z0-9._-]; the prompt part is cut at 40."""
    def safe(text: str, limit: int) -> str:
        return RUNS.sub("-", UNSAFE.sub("-", text)).strip("-.")[:limit].rstrip("-.")
    suffix = FORMATS[fmt][0].removeprefix("trace")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(when))
    return "_".join(part for part in (safe(model, 60) or "model", safe(prompt, 40) or "prompt", stamp)) + suffix


def trace_bytes(trace: Trace, fmt: str) -> bytes:
    """The trace as a file of the format (json | parquet | safetensors), through the engine's writer."""
    if fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / FORMATS[fmt][0]
        save_trace(trace, path)
        return path.read_bytes()


def trace_from_upload(name: str, upload) -> Trace:
    """Read an uploaded trace (bytes, or an upload with .size and .getvalue()); the name's suffix picks the
    format. The size is checked before the bytes are read. Raises TraceFormatError (a ValueError) with a
    message for the page, whatever is wrong with the file."""
    fmt = trace_format(name)  # refuses an unknown suffix with a message naming the accepted ones
    size = len(upload) if isinstance(upload, (bytes, bytearray)) else int(getattr(upload, "size", 0))
    if size > MAX_FILE_BYTES[fmt]:
        raise TraceFormatError(f"{name}: the file has {size / MiB:,.1f} MiB; a {fmt} trace may have at most "
                               f"{MAX_FILE_BYTES[fmt] // MiB} MiB")
    data = upload if isinstance(upload, (bytes, bytearray)) else upload.getvalue()
    if not data:
        raise TraceFormatError(f"{name}: the file is empty")
    try:
        trace = load_trace_bytes(Path(name).name, bytes(data))
    except TraceFormatError:
        raise
    except (MemoryError, RecursionError) as e:
        raise TraceFormatError(f"{name}: too large or too deeply nested to read ({type(e).__name__})") from None
    except Exception as e:  # a parser's own complaint about a foreign file
        raise TraceFormatError(f"{name}: not a readable v41viz trace ({type(e).__name__}: {str(e)[:200]})") from None
    if problem := invalid_text(trace):
        raise TraceFormatError(f"{name}: {problem}")
    return trace


def invalid_text(trace: Trace) -> str:
    """Where a trace holds text that is not valid Unicode (a lone UTF-16 surrogate, which JSON escapes can carry
    but no writer of this project makes), as a clause; '' when all its text is valid."""
    def bad(text: str) -> int:
        return next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), -1)

    def walk(value, where: str, depth: int = 0) -> str:
        if isinstance(value, str):
            i = bad(value)
            return "" if i < 0 else (f"{where} is not valid text: character {i + 1} is a lone UTF-16 surrogate "
                                     f"(U+{ord(value[i]):04X})")
        if depth < 8 and isinstance(value, dict):
            return next((p for k, v in value.items() for p in (walk(k, f"{where} key", depth + 1),
                                                                walk(v, f"{where} '{k}'", depth + 1)) if p), "")
        if depth < 8 and isinstance(value, list):
            return next((p for v in value if (p := walk(v, where, depth + 1))), "")
        return ""

    found = walk(trace.meta, "meta")
    for row in trace.rows():
        for t in trace.tokens(row):
            found = found or walk(t.text, f"the text of token {t.pos} (row {row})")
    for kind in ("moe", "mhc", "engram", "attention"):
        found = found or next((p for path in trace.paths(kind) if (p := walk(path, f"a {kind} module path"))), "")
    return found
