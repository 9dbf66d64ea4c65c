"""The safetensors files of a checkpoint: which files a path names, their headers (checked before any data is read),
the shard index against them, the stored tensors as memory-mapped views, and the check of names, shapes and dtypes."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointError
from .header import read_safetensors_header
from .index import read_weight_map
from .paths import existing

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
VISION_BIAS_SUFFIX = ".ffn.gate.bias_vl"


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors file(s) a path names: a file, a directory with model.safetensors, or a sharded
    directory / model.safetensors.index.json."""
    path = existing(path)
    index = _index_file(path)
    if index is not None:
        weight_map = read_weight_map(index)
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (index.parent / s).is_file()]
        if missing:
            held = [n for n, s in weight_map.items() if s == missing[0]]
            raise CheckpointError(f"{index}: shard file(s) missing: {', '.join(missing[:5])} ({missing[0]} holds "
                                  f"{_names(held, 4)})")
        return [index.parent / s for s in shards]
    if path.is_dir():
        if not ((path / WEIGHTS_NAME).is_file() or (path / WEIGHTS_NAME).is_symlink()):
            raise CheckpointError(f"{path}: directory has neither {WEIGHTS_NAME} nor {INDEX_NAME}: no weights here")
        return [existing(path / WEIGHTS_NAME)]
    return [path]


def _index_file(path: Path) -> Path | None:
    """The shard index a path names (the index itself, or a folder holding one), else None."""
    if path.is_dir():
        return path / INDEX_NAME if (path / INDEX_NAME).is_file() else None
    return path if path.name.endswith(".index.json") else None


def check_index(path: str | Path, found: dict[str, tuple[Path, torch.dtype, tuple[int, ...]]]) -> None:
    """For a sharded checkpoint: every tensor its index maps to a shard is in that shard's header."""
    index = _index_file(Path(path))
    if index is None:
        return
    absent = [(n, s) for n, s in read_weight_map(index).items() if n not in found or found[n][0] != index.parent / s]
    if absent:
        listed = "; ".join(f"'{n}' is not in shard {s}" for n, s in absent[:5])
        more = f" (and {len(absent) - 5} more)" if len(absent) > 5 else ""
        raise CheckpointError(f"{index} maps tensors to shards that do not hold them: {listed}{more}")


def read_header(files: list[Path]) -> dict[str, tuple[Path, torch.dtype, tuple[int, ...]]]:
    """name -> (file, dtype, shape) for every tensor, without reading tensor data (header.py checks each header
    within its limits: a corrupt, truncated or hostile file is refused before safetensors maps it)."""
    found: dict[str, tuple[Path, torch.dtype, tuple[int, ...]]] = {}
    for file in files:
        for name, entry in read_safetensors_header(file).entries.items():
            if name in found:
                raise CheckpointError(f"tensor '{name}' appears in both {found[name][0].name} and {file.name}")
            found[name] = (file, _dtype(entry.code, name, file), entry.shape)
    return found


def check_against(expected: dict[str, torch.Tensor], found: dict[str, tuple[Path, torch.dtype, tuple[int, ...]]],
                  where: str, compatible: Callable[[torch.dtype, torch.dtype], bool] | None = None) -> None:
    """Raise CheckpointError naming every missing, unexpected, mis-shaped or mis-typed tensor. compatible(stored,
    wanted): which stored dtypes the model's tensors take (default: any float precision for a float, integers exact)."""
    compatible = compatible or _compatible
    problems = []
    missing = [n for n in expected if n not in found]
    extra = [n for n in found if n not in expected and not unread_by_text_model(n, expected)]
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_names(missing)}")
    if extra:
        hint = " (quantized '.scale' tensors of the official format are not supported yet)" \
            if any(n.endswith(".scale") for n in extra) else ""
        problems.append(f"unexpected {len(extra)} tensor(s): {_names(extra)}{hint}")
    for name, t in expected.items():
        if name not in found:
            continue
        _, dt, shape = found[name]
        if shape != tuple(t.shape):
            problems.append(f"'{name}' has shape {list(shape)}, the model expects {list(t.shape)}")
        if not compatible(dt, t.dtype):
            problems.append(f"'{name}' is stored as {_short(dt)}, the model expects {_short(t.dtype)}")
    if problems:
        raise CheckpointError(f"{where} does not fit the model: " + "; ".join(problems))


def unread_by_text_model(name: str, expected) -> bool:
    """A stored tensor that a model without a vision tower leaves unread rather than refusing: the image-token
    routing bias `gate.bias_vl`, which only image tokens select with (and such a model has none). Checkpoints this
    project wrote before the routers followed the config's vision setting hold one, all zeros, in every V4.1
    layer; `expected` (the model's tensors) lists it when the config has vision, and then it is required."""
    return name.endswith(VISION_BIAS_SUFFIX) and name not in expected


def stored_tensors(files: list[Path], prefix: str = "", metadata: dict[str, Any] | None = None):
    """(file, name, tensor) for every stored tensor whose name starts with prefix, file by file, each a view of
    the memory-mapped file (safetensors' safe_open), valid after the file's handle is closed; each file's
    metadata is added to `metadata`."""
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                if metadata is not None:
                    metadata.update(f.metadata() or {})
                names = [n for n in f.keys() if n.startswith(prefix)]  # noqa: SIM118 (not iterable)
                tensors = [f.get_tensor(n) for n in names]
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
        yield from ((file, n, t) for n, t in zip(names, tensors))


def _compatible(stored: torch.dtype, wanted: torch.dtype) -> bool:
    """Float storage may be any float precision (bf16 storage of an fp32 model is normal); integer and
    bool tensors must match exactly."""
    return stored == wanted or (stored in FLOAT_DTYPES and wanted in FLOAT_DTYPES)


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
              "F8_E8M0": getattr(torch, "float8_e8m0fnu", torch.uint8)}


def _dtype(code: str, name: str, file: Path) -> torch.dtype:
    if code not in _ST_DTYPES:
        raise CheckpointError(f"{file}: tensor '{name}' has dtype {code}, which this engine cannot load")
    return _ST_DTYPES[code]


def _short(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
