"""Checkpoints: save and load model weights as safetensors (single file or sharded), checked name by name."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from ..placement import build_model, prepare_model
from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError
from ..text.vocab import ID_MAP_NAME, IdMap
from .errors import CheckpointError
from .files import FLOAT_DTYPES, WEIGHTS_NAME, check_against, check_index, checkpoint_files, read_header, stored_tensors
from .finite import check_finite
from .hf_layout import hf_folder, load_hf_checkpoint
from .official_layout import official_folder
from .official_load import load_official_model
from .paths import existing
from .table_range import check_table_range

if TYPE_CHECKING:
    from ..model import Transformer

STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
# Tensors the official checkpoint ships in F32 whatever the storage precision (spec §2.3).
FP32_SUFFIXES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
                 "attn.attn_sink", "ffn.gate.bias", "ffn.gate.bias_vl", "compressor.ape", "hc_head_fn",
                 "hc_head_base", "hc_head_scale")


def save_checkpoint(model: torch.nn.Module, path: str | Path, extra_metadata: dict[str, str] | None = None,
                    *, dtype: str | None = None, args: ModelArgs | None = None) -> Path:
    """Write the model's state_dict to `path` (a .safetensors file, or a directory that gets
    model.safetensors) with config.json beside it. dtype: 'bf16' | 'fp16' | 'fp32' storage for float
    tensors (None keeps each tensor's dtype); the official F32 tensors stay F32. Returns the weights file."""
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
    apply the speed transforms and the expert placement its options ask for (engine.placement.prepare_model). `path`
    may hold the project's layout, the official one (FP8 / FP4, sharded or one model.safetensors) or a transformers
    V4 folder. Returns the config the model was built with: a transformers folder without `mtp.*` weights gives the
    backbone alone (ModelArgs.without_drafter)."""
    existing(path)
    if official_folder(path) is not None:  # FP8 / FP4, sharded or in one file: read lazily, kept quantized
        return load_official_model(path, device, dtype=dtype, token_map=token_map, options=options, config=config)
    args = config if isinstance(config, ModelArgs) or config is None else load_config(config)
    if hf_folder(path) is not None:  # a transformers save_pretrained folder (V4): its names, bf16, no drafter
        return load_hf_checkpoint(path, device, dtype=dtype, token_map=token_map, options=options, config=args)
    if args is None:
        args = load_config(config_beside(path))
    check_index(path, read_header(checkpoint_files(path)))  # a broken file is refused before the model is built
    model = build_model(args, token_map, dtype=dtype, device=device, options=options)   # experts placed (options)
    load_weights(model, path)
    return args, prepare_model(model)


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


def load_weights(model: torch.nn.Module, path: str | Path, prefix: str = "") -> dict[str, Any]:
    """Check every tensor against model.state_dict() (names, shapes, dtypes), every value for NaN / Inf and every
    routing table for expert ids the model lacks (table_range.py), then copy them in (cast to the model's dtype).
    Nothing is modified unless the whole checkpoint fits and is finite: the tensors are memory-mapped views, all
    checked before the first is copied. prefix: only the tensors whose names start with it, on both sides (e.g.
    "mtp." to take another checkpoint's drafter).
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
    stored = [(file, name, t) for file, name, t in stored_tensors(files, prefix, metadata)   # memory-mapped views
              if name in state]                        # what check_against let pass unread (unread_by_text_model)
    for file, name, tensor in stored:
        check_finite(tensor, name, str(file))
        check_table_range(state, name, tensor, str(file))
    with torch.no_grad():
        for _, name, tensor in stored:
            target = state[name]
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
    return metadata
