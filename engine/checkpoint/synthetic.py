"""`engine quantize --synthetic`: seeded random weights for any config, written straight into the official layout
(FP8 + E8M0 blocks, packed MXFP4 experts, FP8 Engram rows, BF16 / F32 as the inventory says; shards + index).

Why: a checkpoint at the release's widths (a 5,120-wide embedding of 129,280 rows, 512-wide heads) that the lazy
loader reads like the real one, without ever building the unquantized model: each tensor is drawn a block of rows
at a time from its own generator (engine.model.init's rules, so the logits are finite), quantized with
engine.quant.formats and written to its place in the shard (engine.checkpoint.stream_file). The writer's memory is
a few blocks of rows, whatever the checkpoint's size."""
from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ..accounting.inventory import TensorSpec, inventory_tuple
from ..model.init import initial_value
from ..spec.config import ModelArgs, load_config
from .errors import CheckpointError
from .official_layout import (
    CONFIG_NAME,
    INDEX_NAME,
    official_args,
    official_config,
    scale_block,
    scale_name,
    shard_name,
)
from .official_writer import (
    DEFAULT_SHARD_BYTES,
    WrittenCheckpoint,
    encode,
    prepare_folder,
    split_groups,
    weight_groups,
)
from .stream_file import StreamedFile

SYNTHETIC_PRODUCER = "v41viz engine quantize --synthetic"   # the shards' metadata: how reuse_or_write knows its own
BLOCK_VALUES = 1 << 22   # values drawn at once (16 MiB in fp32; quantizing holds a few such blocks)


def write_synthetic(config: ModelArgs | str | Path, out: str | Path, seed: int = 0, shards: int | None = None,
                    block_values: int = BLOCK_VALUES) -> WrittenCheckpoint:
    """Write seeded random weights of `config` (ModelArgs or a config path) in the official layout into the new or
    empty folder `out`, in `shards` files (default: one per ~5 GiB). The same seed and block_values give the same
    bytes."""
    args = official_args(config if isinstance(config, ModelArgs) else load_config(config))
    inventory = inventory_tuple(args)
    groups = weight_groups(inventory)
    total = sum(spec.nbytes for spec in inventory)
    count = shards if shards is not None else max(1, -(-total // DEFAULT_SHARD_BYTES))
    if count < 1 or count > len(groups):
        raise CheckpointError(f"--shards must be between 1 and {len(groups)} (weights with their scales), got {count}")
    out = Path(out)
    prepare_folder(out)
    weight_map: dict[str, str] = {}
    written: list[Path] = []
    metadata = {"format": "pt", "producer": f"{SYNTHETIC_PRODUCER} (seed {seed})"}
    for i, part in enumerate(split_groups(groups, count)):
        path = out / shard_name(i, count)
        with StreamedFile(path, [spec for group in part for spec in group], metadata) as file:
            for group in part:
                _write_group(file, group, args, seed, block_values)
        weight_map.update({spec.name: path.name for group in part for spec in group})
        written.append(path)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (out / CONFIG_NAME).write_text(json.dumps(official_config(args), indent=2) + "\n", encoding="utf-8")
    return WrittenCheckpoint(out, written, len(weight_map), total, 0)


def _write_group(file: StreamedFile, group: list[TensorSpec], args: ModelArgs, seed: int, block_values: int) -> None:
    """A weight (and its scale) block of rows by block of rows; a block spans whole scale blocks."""
    spec = group[0]
    scale_rows = scale_block(spec.name, spec.dtype, args)[0] if len(group) > 1 else 1
    for first, values in _row_blocks(spec, args, seed, block_values, scale_rows):
        encoded = encode(spec, values, args)
        file.write(spec.name, first, encoded[spec.name])
        if len(group) > 1:
            file.write(scale_name(spec.name), first // scale_rows, encoded[scale_name(spec.name)])


def _row_blocks(spec: TensorSpec, args: ModelArgs, seed: int, block_values: int,
                scale_rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, float values [rows, ...]) of the logical tensor (an FP4 weight's [out, in], not its packed
    bytes); each block from a generator seeded by the seed, the name and the block's first row."""
    shape = (spec.shape[0], 2 * spec.shape[1]) if spec.dtype == "I8" else spec.shape
    name_seed = zlib.crc32(spec.name.encode())
    if len(shape) == 1 or spec.dtype == "I64":
        yield 0, _values(spec, shape, args, _generator(seed, name_seed, 0))
        return
    width = shape[1]
    step = max(scale_rows, block_values // width // scale_rows * scale_rows)
    for first in range(0, shape[0], step):
        rows = min(step, shape[0] - first)
        yield first, _values(spec, (rows, width), args, _generator(seed, name_seed, first))


def _values(spec: TensorSpec, shape: tuple[int, ...], args: ModelArgs, gen: torch.Generator) -> torch.Tensor:
    if spec.dtype == "I64":   # V4 hash routing (gate.tid2eid): distinct experts per token id, as init_weights draws
        return torch.rand(shape[0], args.n_routed_experts, generator=gen).argsort(-1)[:, : shape[1]]
    return initial_value(spec.name, shape, args, gen)


def _generator(seed: int, name_seed: int, first_row: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + name_seed * 65_537 + first_row) % 2 ** 63)


def reuse_or_write(config: ModelArgs | str | Path, out: str | Path, seed: int = 0) -> tuple[Path, bool]:
    """(folder, written): the synthetic checkpoint of `config` in `out`, reused when its config.json and producer
    say this config and seed (what a rehearsal of several gigabytes needs: written once); an older synthetic
    checkpoint there (another config or seed) is replaced; anything else in the folder is refused."""
    args = official_args(config if isinstance(config, ModelArgs) else load_config(config))
    out = Path(out)
    index = out / INDEX_NAME
    if index.is_file() and (out / CONFIG_NAME).is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        with safe_open(str(out / shards[0]), framework="pt") as f:
            producer = (f.metadata() or {}).get("producer", "")
        same_config = json.loads((out / CONFIG_NAME).read_text(encoding="utf-8")) == official_config(args)
        if same_config and producer.endswith(f"(seed {seed})"):
            return out, False
        if not producer.startswith(SYNTHETIC_PRODUCER):
            raise CheckpointError(f"{out} holds a checkpoint that engine quantize --synthetic did not write; remove "
                                  f"it or choose another folder")
        for name in (*shards, INDEX_NAME, CONFIG_NAME):   # our own older synthetic weights: replaced
            (out / name).unlink()
    write_synthetic(args, out, seed=seed)
    return out, True
