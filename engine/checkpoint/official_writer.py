"""Writing the official checkpoint format from one of this project's checkpoints: FP8 + E8M0 block scales,
MXFP4 routed experts, FP8 Engram rows, BF16 / F32 as the inventory says, sharded with an index."""
from __future__ import annotations

import json
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..accounting.inventory import TensorSpec, inventory_tuple
from ..quant.formats import quantize_engram_rows, quantize_fp4, quantize_fp8
from ..spec.config import ModelArgs, load_config
from ..text.vocab import ID_MAP_NAME
from .errors import CheckpointError
from .files import checkpoint_files, read_header, stored_tensors, unread_by_text_model
from .finite import check_finite
from .official import TORCH_DTYPES
from .official_layout import (
    CONFIG_NAME,
    ENGRAM_TABLE_SUFFIX,
    INDEX_NAME,
    official_args,
    official_config,
    official_folder,
    scale_name,
    shard_name,
)
from .store import config_beside

DEFAULT_SHARD_BYTES = 5 << 30     # without --shards: about 5 GiB per shard (the release: 48 of about 10 GiB)
FLOAT_SOURCES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class WrittenCheckpoint:
    folder: Path
    shards: list[Path]
    n_tensors: int
    total_bytes: int
    source_bytes: int


def write_official(source: str | Path, out: str | Path, shards: int | None = None) -> WrittenCheckpoint:
    """Convert the project checkpoint `source` (engine.checkpoint.store format, any float precision) into the
    official layout of its architecture in the folder `out`: the tensors of tensor_inventory(official_args(args)),
    each weight next to its scale in `shards` files of about equal size. Source tensors are read memory-mapped
    one at a time; one shard's tensors are held in memory while it is written."""
    out = Path(out)
    if official_folder(source) is not None:
        raise CheckpointError(f"{source} is already in the official format")
    files = checkpoint_files(source)
    args = official_args(load_config(config_beside(source)))
    inventory = inventory_tuple(args)
    header = read_header(files)
    _check_source(header, inventory, source)
    for file, name, value in stored_tensors(files):  # NaN / Inf would quantize to NaN codes: refuse before writing
        check_finite(value, name, str(file))
    groups = weight_groups(inventory)
    count = shards if shards is not None else max(1, -(-sum(s.nbytes for s in inventory) // DEFAULT_SHARD_BYTES))
    if count < 1 or count > len(groups):
        raise CheckpointError(f"--shards must be between 1 and {len(groups)} (weights with their scales), got {count}")
    prepare_folder(out)
    weight_map: dict[str, str] = {}
    written: list[Path] = []
    for i, part in enumerate(split_groups(groups, count)):
        tensors = _encode_part(part, header, args)
        file = out / shard_name(i, count)
        save_file(tensors, str(file), metadata={"format": "pt", "producer": "v41viz engine quantize"})
        weight_map.update({name: file.name for name in tensors})
        written.append(file)
        del tensors
    total = sum(spec.nbytes for spec in inventory)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (out / CONFIG_NAME).write_text(json.dumps(official_config(args), indent=2) + "\n", encoding="utf-8")
    id_map = files[0].parent / ID_MAP_NAME
    if id_map.is_file():
        shutil.copyfile(id_map, out / ID_MAP_NAME)
    return WrittenCheckpoint(out, written, len(weight_map), total, sum(f.stat().st_size for f in files))


def _check_source(header: dict, inventory: tuple[TensorSpec, ...], source) -> None:
    """Every official weight (scales aside) must be in the source at its logical shape, nothing else."""
    problems = []
    wanted = {spec.name: spec for spec in inventory if not spec.is_scale}
    for name, spec in wanted.items():
        if name not in header:
            problems.append(f"'{name}' is missing")
            continue
        file, dtype, shape = header[name]
        logical = (spec.shape[0], 2 * spec.shape[1]) if spec.dtype == "I8" else spec.shape
        if shape != logical:
            problems.append(f"'{name}' in {file.name} has shape {list(shape)}; the config needs {list(logical)}")
        elif (dtype != torch.int64) if spec.dtype == "I64" else (dtype not in FLOAT_SOURCES):
            problems.append(f"'{name}' in {file.name} is {str(dtype).removeprefix('torch.')}, not a "
                            f"{'int64' if spec.dtype == 'I64' else 'float'} tensor")
    extra = [n for n in header if n not in wanted and not unread_by_text_model(n, wanted)]
    if extra:
        problems.append(f"{len(extra)} tensor(s) the config does not have, e.g. '{extra[0]}'")
    if problems:
        raise CheckpointError(f"{source} does not fit its config.json: " + "; ".join(problems[:8]))


def weight_groups(inventory: tuple[TensorSpec, ...]) -> list[list[TensorSpec]]:
    """The inventory in order, each quantized weight grouped with its scale (they go to the same shard)."""
    scales = {spec.name: spec for spec in inventory if spec.is_scale}
    return [[spec] + ([scales[scale_name(spec.name)]] if scale_name(spec.name) in scales else [])
            for spec in inventory if not spec.is_scale]


def split_groups(groups: list[list[TensorSpec]], count: int) -> list[list[list[TensorSpec]]]:
    """`count` consecutive runs of groups, none empty, each closed once it reaches its share of the bytes."""
    sizes = [sum(spec.nbytes for spec in group) for group in groups]
    target = sum(sizes) / count
    parts: list[list[list[TensorSpec]]] = [[]]
    filled = 0.0
    for i, (group, size) in enumerate(zip(groups, sizes)):
        left_groups, left_parts = len(groups) - i, count - len(parts)
        if parts[-1] and left_parts and (filled + size / 2 > target * len(parts) or left_groups <= left_parts):
            parts.append([])
        parts[-1].append(group)
        filled += size
    return parts


def _encode_part(part: list[list[TensorSpec]], header: dict, args: ModelArgs) -> dict[str, torch.Tensor]:
    """The stored tensors of one shard, each checked against its inventory spec."""
    tensors: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        handles: dict[Path, object] = {}
        for group in part:
            file = header[group[0].name][0]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(str(file), framework="pt"))
            encoded = encode(group[0], handles[file].get_tensor(group[0].name), args)
            for spec in group:
                got = encoded[spec.name]
                if tuple(got.shape) != spec.shape or got.dtype != TORCH_DTYPES[spec.dtype]:
                    raise CheckpointError(f"quantizing '{spec.name}' gave {got.dtype} {list(got.shape)}, but the "
                                          f"official layout stores {spec.dtype} {list(spec.shape)}")
            tensors.update(encoded)
    return tensors


def encode(spec: TensorSpec, value: torch.Tensor, args: ModelArgs) -> dict[str, torch.Tensor]:
    """One source tensor → its stored form under spec.name (and `.scale` for FP8 / FP4), contiguous, CPU."""
    if spec.dtype == "I8":
        packed, scale = quantize_fp4(value)
        return {spec.name: packed, scale_name(spec.name): scale}
    if spec.dtype == "F8_E4M3":
        if spec.name.endswith(ENGRAM_TABLE_SUFFIX):
            q, scale = quantize_engram_rows(value)
        else:
            q, scale = quantize_fp8(value, tuple(args.weight_block_size))
        return {spec.name: q, scale_name(spec.name): scale}
    if spec.dtype == "I64":
        return {spec.name: value.clone()}
    return {spec.name: value.to(torch.bfloat16 if spec.dtype == "BF16" else torch.float32).contiguous().clone()}


def prepare_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a folder")
    if out.is_dir() and (any(out.glob("*.safetensors")) or (out / INDEX_NAME).exists()):
        raise CheckpointError(f"{out} already holds a checkpoint; choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
