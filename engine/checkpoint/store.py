"""Checkpoints: save and load model weights as safetensors (single file or sharded), checked name by name."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError, MissingFileError
from .errors import CheckpointError
from .official_layout import official_folder

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
    if official_folder(path) is not None:  # FP8 / FP4 shards with an index: read lazily, kept quantized
        from .official_load import load_official_model
        return load_official_model(path, device, dtype=dtype, token_map=token_map, options=options, config=config)
    args = config if isinstance(config, ModelArgs) else load_config(config or config_beside(path))
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
    full-vocabulary one. CheckpointError if its size differs from the config's vocab_size."""
    from ..text.vocab import ID_MAP_NAME, IdMap
    file = _weights_folder(path) / ID_MAP_NAME
    if not file.is_file():
        return None
    id_map = IdMap.load(file, tokenizer)
    if id_map.vocab_size != vocab_size:
        raise CheckpointError(f"{file} lists {id_map.vocab_size} token ids but the checkpoint's config has "
                              f"vocab_size {vocab_size}; the id map belongs to another model")
    return id_map


def _weights_folder(path: str | Path) -> Path:
    """The folder holding the weights `path` names; an official-format folder is taken as it is, so that a
    missing shard is reported by its loader, with the tensors it holds."""
    return official_folder(path) or checkpoint_files(path)[0].parent


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors file(s) a path names: a file, a directory with model.safetensors, or a sharded
    directory / model.safetensors.index.json."""
    path = Path(path)
    if path.is_dir():
        if (path / INDEX_NAME).is_file():
            path = path / INDEX_NAME
        elif (path / WEIGHTS_NAME).is_file():
            return [path / WEIGHTS_NAME]
        else:
            raise CheckpointError(f"{path}: directory has neither {WEIGHTS_NAME} nor {INDEX_NAME}")
    if not path.exists():
        raise MissingFileError(f"{path}: no such checkpoint")
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: not a safetensors index (needs a 'weight_map' object): {e}") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path.parent / s).is_file()]
        if missing:
            raise CheckpointError(f"{path}: shard file(s) missing: {', '.join(missing[:5])}")
        return [path.parent / s for s in shards]
    return [path]


def read_header(files: list[Path]) -> dict[str, tuple[Path, torch.dtype, tuple[int, ...]]]:
    """name -> (file, dtype, shape) for every tensor, without reading tensor data."""
    from safetensors import SafetensorError, safe_open
    found: dict[str, tuple[Path, torch.dtype, tuple[int, ...]]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name in found:
                        raise CheckpointError(f"tensor '{name}' appears in both {found[name][0].name} and {file.name}")
                    sl = f.get_slice(name)
                    found[name] = (file, _dtype(sl.get_dtype(), name, file), tuple(sl.get_shape()))
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
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
    """Check every tensor against model.state_dict(), then copy them in (cast to the model's dtype).
    Nothing is modified unless the whole checkpoint fits. prefix: only the tensors whose names start with
    it, on both sides (e.g. "mtp." to take another checkpoint's drafter). Returns the file metadata."""
    from safetensors import safe_open
    files = checkpoint_files(path)
    found = {n: v for n, v in read_header(files).items() if n.startswith(prefix)}
    state = {n: t for n, t in model.state_dict().items() if n.startswith(prefix)}
    if prefix and not state:
        raise CheckpointError(f"the model has no tensors named '{prefix}*' to load from {path}")
    check_against(state, found, f"{path} ('{prefix}*' tensors)" if prefix else str(path))
    metadata: dict[str, Any] = {}
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                metadata.update(f.metadata() or {})
                for name in (n for n in f.keys() if n.startswith(prefix)):
                    target = state[name]
                    target.copy_(f.get_tensor(name).to(device=target.device, dtype=target.dtype))
    return metadata


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
