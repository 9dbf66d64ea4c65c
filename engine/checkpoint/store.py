"""Checkpoints: save and load model weights as safetensors (single file or sharded), checked name by name."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError
from .errors import CheckpointError
from .finite import check_finite
from .header import read_safetensors_header
from .index import read_weight_map
from .official_layout import official_folder
from .paths import existing

if TYPE_CHECKING:
    from ..model import Transformer

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Tensors the official checkpoint ships in F32 whatever the storage precision (spec §2.3).
FP32_SUFFIXES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
                 "attn.attn_sink", "ffn.gate.bias", "ffn.gate.bias_vl")


def save_checkpoint(model: torch.nn.Module, path: str | Path, extra_metadata: dict[str, str] | None = None,
                    *, dtype: str | None = None, args: ModelArgs | None = None) -> Path:
    """Write the model's state_dict to `path` (a .safetensors file, or a directory that gets
    model.safetensors) with config.json beside it. dtype: 'bf16' | 'fp16' | 'fp32' storage for float
    tensors (None keeps each tensor's dtype); the official F32 tensors stay F32. Returns the weights file."""
    from safetensors.torch import save_file
    path = Path(path)
    file = path if path.suffix == ".safetensors" else path / WEIGHTS_NAME
    file.parent.mkdir(parents=True, exist_ok=True)
    if dtype is not None and dtype not in STORAGE_DTYPES:
        raise InputError(f"save_checkpoint: dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    tensors = {}
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu")
        if dtype is not None and t.dtype in FLOAT_DTYPES and not name.endswith(FP32_SUFFIXES):
            t = t.to(STORAGE_DTYPES[dtype])
        tensors[name] = t.contiguous().clone()  # clone: safetensors refuses tensors that share storage
    metadata = {"format": "pt", "producer": "v41viz", **{str(k): str(v) for k, v in (extra_metadata or {}).items()}}
    save_file(tensors, str(file), metadata=metadata)
    args = args or getattr(model, "args", None)
    if isinstance(args, ModelArgs):
        config = {k: v for k, v in args.to_dict().items() if k != "name"}
        (file.parent / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return file


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32,
                    token_map=None, options=None, config: ModelArgs | str | Path | None = None
                    ) -> tuple[ModelArgs, "Transformer"]:
    """Build the model described by `config` (default: the config.json beside `path`), load its weights and
    apply the speed transforms its options ask for (engine.speedups.prepare_for_inference)."""
    from ..model import Transformer
    from ..speedups import prepare_for_inference
    existing(path)
    if official_folder(path) is not None:  # FP8 / FP4 shards with an index: read lazily, kept quantized
        from .official_load import load_official_model
        return load_official_model(path, device, dtype=dtype, token_map=token_map, options=options, config=config)
    args = config if isinstance(config, ModelArgs) else load_config(config or config_beside(path))
    check_index(path, read_header(checkpoint_files(path)))  # a broken file is refused before the model is built
    model = Transformer(args, token_map, dtype=dtype, device=device, options=options)
    load_weights(model, path)
    return args, prepare_for_inference(model)


def config_beside(path: str | Path) -> Path:
    """The config.json that save_checkpoint writes next to the weights (or that an official folder holds)."""
    found = _weights_folder(path) / "config.json"
    if not found.is_file():
        raise CheckpointError(f"{path}: no config.json beside the weights; pass the model config explicitly")
    return found


def id_map_beside(path: str | Path, tokenizer, vocab_size: int):
    """The IdMap of a reduced-vocabulary checkpoint (id_map.json beside the weights), or None for a
    full-vocabulary one. CheckpointError if the file is unreadable or malformed, if its size differs from the
    config's vocab_size, or if a config smaller than the tokenizer's vocabulary comes without one."""
    from ..text.vocab import ID_MAP_NAME, IdMap
    file = _weights_folder(path) / ID_MAP_NAME
    if not file.is_file():
        if vocab_size < tokenizer.full_vocab_size:
            raise CheckpointError(f"{file.parent}: {ID_MAP_NAME} is missing: the config's vocab_size {vocab_size} is "
                                  f"a reduced vocabulary (the tokenizer has {tokenizer.full_vocab_size} ids), and "
                                  f"only the {ID_MAP_NAME} saved with the weights says which tokens the model's ids "
                                  "are; copy it next to the weights")
        return None
    try:
        id_map = IdMap.load(file, tokenizer)
    except InputError as e:  # a malformed map is a broken checkpoint
        raise CheckpointError(str(e)) from None
    if id_map.vocab_size != vocab_size:
        raise CheckpointError(f"{file} lists {id_map.vocab_size} token ids but the checkpoint's config has "
                              f"vocab_size {vocab_size}; the id map belongs to another model")
    return id_map


def _weights_folder(path: str | Path) -> Path:
    """The folder holding the weights `path` names; an official-format folder is taken as it is, so that a
    missing shard is reported by its loader, with the tensors it holds."""
    path = existing(path)
    official = official_folder(path)
    if official is not None:
        return official
    checkpoint_files(path)  # a folder without weights, or a broken index, is reported here
    return path if path.is_dir() else path.parent


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
                  where: str) -> None:
    """Raise CheckpointError naming every missing, unexpected, mis-shaped or mis-typed tensor."""
    problems = []
    missing = [n for n in expected if n not in found]
    extra = [n for n in found if n not in expected]
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
        if not _compatible(dt, t.dtype):
            problems.append(f"'{name}' is stored as {_short(dt)}, the model expects {_short(t.dtype)}")
    if problems:
        raise CheckpointError(f"{where} does not fit the model: " + "; ".join(problems))


def load_weights(model: torch.nn.Module, path: str | Path, prefix: str = "") -> dict[str, Any]:
    """Check every tensor against model.state_dict() (names, shapes, dtypes) and every value for NaN / Inf,
    then copy them in (cast to the model's dtype). Nothing is modified unless the whole checkpoint fits and
    is finite: the tensors are memory-mapped views, all checked before the first is copied. prefix: only the
    tensors whose names start with it, on both sides (e.g. "mtp." to take another checkpoint's drafter).
    Returns the file metadata."""
    files = checkpoint_files(path)
    found = read_header(files)
    check_index(path, found)
    found = {n: v for n, v in found.items() if n.startswith(prefix)}
    state = {n: t for n, t in model.state_dict().items() if n.startswith(prefix)}
    if prefix and not state:
        raise CheckpointError(f"the model has no tensors named '{prefix}*' to load from {path}")
    check_against(state, found, f"{path} ('{prefix}*' tensors)" if prefix else str(path))
    metadata: dict[str, Any] = {}
    stored = list(stored_tensors(files, prefix, metadata))   # views of the memory-mapped files
    for file, name, tensor in stored:
        check_finite(tensor, name, str(file))
    with torch.no_grad():
        for _, name, tensor in stored:
            target = state[name]
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
    return metadata


def stored_tensors(files: list[Path], prefix: str = "", metadata: dict[str, Any] | None = None):
    """(file, name, tensor) for every stored tensor whose name starts with prefix, file by file, each a view of
    the memory-mapped file (safetensors' safe_open), valid after the file's handle is closed; each file's
    metadata is added to `metadata`."""
    from safetensors import SafetensorError, safe_open
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
