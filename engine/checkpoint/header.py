"""A safetensors file's header, read within fixed limits and checked entry by entry before any tensor data is read."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

MAX_HEADER_BYTES = 16 << 20   # all 95,819 tensors of V4.1-Flash in one file need 11.5 MiB; parsing 16 MiB takes <200 MB
# bytes per element of every safetensors dtype code this engine can load
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
              "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
METADATA_KEY = "__metadata__"
UNREADABLE = "not a readable safetensors file"   # every refusal here says so, then what is wrong
MAX_DIMS = 16


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the header: its dtype code, shape and byte range in the data section."""
    name: str
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    file: Path
    entries: dict[str, TensorEntry]   # in the order the header lists them
    metadata: dict[str, str]
    data_start: int                   # offset of the data section in the file (8 + header length)


def read_safetensors_header(file: str | Path) -> SafetensorsHeader:
    """Read and check `file`'s header: a length within the file and MAX_HEADER_BYTES, a JSON object of tensor
    entries each with a known dtype, a shape of non-negative integers and a byte range the size of that shape,
    the ranges back to back and covering the data section exactly (what safetensors itself demands).
    CheckpointError naming the file, the tensor and the problem otherwise. Reads only the header's bytes."""
    file = Path(file)
    try:
        with open(file, "rb") as f:
            size = f.seek(0, 2)
            if size < 8:
                what = "it is empty" if size == 0 else f"it has only {size} bytes"
                raise CheckpointError(f"{file}: {UNREADABLE}: {what} (a safetensors file starts with an "
                                      "8-byte header length)")
            f.seek(0)
            declared = int.from_bytes(f.read(8), "little")
            if declared > size - 8:
                raise CheckpointError(f"{file}: {UNREADABLE} (truncated?): its first 8 bytes declare a "
                                      f"header of {declared:,} bytes but the file has only {size:,} bytes")
            if declared > MAX_HEADER_BYTES:
                raise CheckpointError(f"{file}: {UNREADABLE}: its header declares {declared:,} bytes, more than the "
                                      f"{MAX_HEADER_BYTES >> 20} MiB this engine reads")
            text = f.read(declared)
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read the checkpoint file ({e.strerror or e})") from None
    raw = _parse(file, text)
    metadata = raw.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{file}: {UNREADABLE}: the header's '{METADATA_KEY}' must map names to strings")
    entries = {name: _entry(file, name, value) for name, value in raw.items()}
    _check_layout(file, entries, size - 8 - declared)
    return SafetensorsHeader(file, entries, metadata, 8 + declared)


def _parse(file: Path, text: bytes) -> dict:
    def no_repeats(pairs: list[tuple[str, object]]) -> dict:
        seen: dict[str, object] = {}
        for key, value in pairs:
            if key in seen:
                raise CheckpointError(f"{file}: {UNREADABLE}: the header lists '{key}' more than once")
            seen[key] = value
        return seen
    try:
        raw = json.loads(text.decode("utf-8"), object_pairs_hook=no_repeats)
    except (ValueError, RecursionError) as e:  # ValueError: bad UTF-8, bad JSON, an integer of 4,300+ digits
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise CheckpointError(f"{file}: {UNREADABLE} (truncated?): its header is not JSON "
                              f"({reason})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: {UNREADABLE}: its header is a JSON {type(raw).__name__}, "
                              "not an object of tensors")
    return raw


def _entry(file: Path, name: str, value: object) -> TensorEntry:
    where = f"{file}: {UNREADABLE}: tensor '{name}'"
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{where} needs exactly 'dtype', 'shape' and 'data_offsets' in the header")
    code, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(code, str) or code not in ITEM_BYTES:
        raise CheckpointError(f"{where} has dtype {_short(code)}, which this engine cannot load "
                              f"(it reads {', '.join(ITEM_BYTES)})")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where} has shape {_short(shape)}; a shape is a list of at most {MAX_DIMS} "
                              "non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise CheckpointError(f"{where} has data_offsets {_short(offsets)}; they must be [begin, end] with "
                              "0 <= begin <= end")
    wanted = math.prod(shape) * ITEM_BYTES[code]
    if offsets[1] - offsets[0] != wanted:
        raise CheckpointError(f"{where}: {code} {shape} needs {wanted:,} bytes but its data_offsets {offsets} "
                              f"span {offsets[1] - offsets[0]:,}")
    return TensorEntry(name, code, tuple(shape), offsets[0], offsets[1])


def _check_layout(file: Path, entries: dict[str, TensorEntry], data_bytes: int) -> None:
    """The byte ranges, in file order, must follow one another from 0 to the end of the file."""
    at, previous = 0, None
    refuse = f"{file}: {UNREADABLE}"
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.end > data_bytes:
            raise CheckpointError(f"{refuse}: truncated: tensor '{e.name}' lies at data bytes {e.begin:,}..{e.end:,} "
                                  f"but the file holds only {data_bytes:,} bytes of tensor data")
        if e.begin < at:
            raise CheckpointError(f"{refuse}: tensors '{previous}' and '{e.name}' overlap (data bytes "
                                  f"{e.begin:,}..{e.end:,} begin before {at:,})")
        if e.begin > at:
            raise CheckpointError(f"{refuse}: {e.begin - at:,} unclaimed bytes before tensor '{e.name}' "
                                  f"(data bytes {at:,}..{e.begin:,} belong to no tensor)")
        at, previous = e.end, e.name
    if at != data_bytes:
        raise CheckpointError(f"{refuse}: {data_bytes - at:,} bytes after the last tensor belong to no tensor "
                              "(a damaged or partly overwritten file)")


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
