"""Official-format checkpoints for tests: random bytes in the official layout of any config (a real loader input
of a few hundred MB in seconds, no writer run), or an initialised tiny model quantized by `engine quantize`'s
writer (values that generate meaningful text); and a process's resident memory from /proc."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.accounting.inventory import TensorSpec, inventory_tuple
from engine.checkpoint.official_layout import (
    ENGRAM_TABLE_SUFFIX,
    INDEX_NAME,
    official_args,
    official_config,
    scale_name,
    shard_name,
)
from engine.checkpoint.official_writer import WrittenCheckpoint, encode, write_official
from engine.checkpoint.store import save_checkpoint
from engine.checkpoint.synthetic import reuse_or_write
from engine.model import Transformer, init_weights
from engine.plan.memory_fit import process_memory
from engine.spec.config import ModelArgs, load_config
from engine.spec.engram_layout import EngramLayout

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "checkpoints" / "default"
REHEARSAL_CONFIG = ROOT / "configs" / "v4.1-flash-rehearsal.json"
REHEARSAL = ROOT / "checkpoints" / "v4.1-flash-rehearsal"   # 6.2 GiB: written once, reused (git-ignored)
DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8,
          "BF16": torch.bfloat16, "F32": torch.float32}
E4M3_MODEST = 0xBF      # clears the exponent's top bit: |code| <= 1.875, never the NaN codes 0x7F / 0xFF
E8M0_MODEST = (123, 128)  # row scales 2^-4 .. 2^0


def write_random_official(folder: Path, n_shards: int, args: ModelArgs | None = None,
                          values: dict[str, torch.Tensor] | None = None) -> dict[str, int]:
    """The official layout of `args` (default: the default checkpoint's architecture widened to 96 routed
    experts of width 1024, ~260 MiB) in `n_shards` shards: a real loader input without a writer run.
    Without `values`, random bytes in every tensor, each value's exponent kept finite (the loader refuses NaN / Inf
    weights); with them (float tensors by name, e.g. an initialised
    model's state dict) each tensor is encoded as `engine quantize` does, and the Engram tables, absent from
    `values`, get valid random codes (valid_engram_table): a checkpoint that generates finite logits."""
    args = args or official_args(load_config(DEFAULT / "config.json")).replace(n_routed_experts=96, moe_inter_dim=1024)
    inventory = inventory_tuple(args)
    total = sum(spec.nbytes for spec in inventory)
    gen = torch.Generator().manual_seed(0)
    weight_map, part, made, filled, shard = {}, {}, {}, 0, 0
    for i, spec in enumerate(inventory):
        if spec.name not in made:   # a weight's scale is made with it
            made.update(stored_tensors(spec, args, values, gen))
        part[spec.name] = made.pop(spec.name)
        filled += spec.nbytes
        last = i + 1 == len(inventory)
        next_is_weight = not last and not inventory[i + 1].is_scale   # a scale stays with its weight
        if last or (next_is_weight and filled >= total * (shard + 1) / n_shards):
            name = shard_name(shard, n_shards)
            save_file(part, str(folder / name))
            weight_map.update(dict.fromkeys(part, name))
            part, shard = {}, shard + 1
    assert shard == n_shards and not made
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(official_config(args)))
    host = [s for s in inventory if ".engram.embed." in s.name]   # memory-mapped, never loaded whole
    return {"total": total, "largest": max(s.nbytes for s in inventory if s not in host),
            "engram": sum(s.nbytes for s in host)}


def stored_tensors(spec: TensorSpec, args: ModelArgs, values: dict[str, torch.Tensor] | None,
                   gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The stored tensor(s) for one inventory entry: {name: tensor}, plus `.scale` for a quantized weight."""
    if values is None:
        raw = torch.randint(0, 256, (spec.nbytes,), dtype=torch.uint8, generator=gen)
        raw.view(-1, DTYPES[spec.dtype].itemsize)[:, -1] &= E4M3_MODEST   # top exponent bit of each value cleared
        return {spec.name: raw.view(DTYPES[spec.dtype]).reshape(spec.shape)}
    if spec.name.endswith(ENGRAM_TABLE_SUFFIX):
        return valid_engram_table(spec, args, gen)
    return encode(spec, values[spec.name], args)


def valid_engram_table(spec: TensorSpec, args: ModelArgs, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """An Engram table [rows, head_dim] of random FP8 codes of modest magnitude and its E8M0 row scales
    [rows, head_dim/32] near 2^-4..2^0: valid values at memory speed (quantizing a float table of over 1 GiB
    of rows would take minutes and four times the memory)."""
    codes = torch.randint(0, 256, spec.shape, dtype=torch.uint8, generator=gen)
    codes &= E4M3_MODEST
    rows, head_dim = spec.shape
    scale = torch.randint(*E8M0_MODEST, (rows, -(-head_dim // 32)), dtype=torch.uint8, generator=gen)
    return {spec.name: codes.view(torch.float8_e4m3fn), scale_name(spec.name): scale.view(torch.float8_e8m0fnu)}


def engram_heavy_args(table_bytes: int, base: ModelArgs | None = None) -> ModelArgs:
    """`base` (default: the default checkpoint's architecture in the official layout) with engram_vocab_size
    raised so that its Engram tables (FP8 rows + E8M0 scales, all layers) hold at least `table_bytes`; nothing
    else changes."""
    base = base or official_args(load_config(DEFAULT / "config.json"))
    row_bytes = base.engram_head_dim + -(-base.engram_head_dim // 32)
    rows_per_column = -(-table_bytes // (row_bytes * len(base.engram_layer_ids) * base.engram_n_columns))
    layout = EngramLayout(base.engram_layer_ids, rows_per_column, base.engram_max_ngram_size, base.engram_n_heads,
                          base.engram_compressed_vocab_size)
    return base.replace(engram_vocab_size=rows_per_column,
                        engram_num_embeddings=tuple(sum(sizes) for sizes in layout.table_sizes()))


def rehearsal_folder() -> Path:
    """The full-width rehearsal's synthetic official folder (scripts/rehearsal.py writes the same one): written
    on first use (minutes), then reused."""
    return reuse_or_write(REHEARSAL_CONFIG, REHEARSAL)[0]


def write_tiny_official(folder: Path, args: ModelArgs, seed: int = 0, shards: int = 3) -> WrittenCheckpoint:
    """An initialised model of `args` (fp32, seeded) saved in the project's layout beside `folder`, then written
    in the official layout into `folder` by `engine quantize`'s writer: FP8 + E8M0 blocks, MXFP4 experts."""
    model = Transformer(args)
    init_weights(model, seed)
    source = save_checkpoint(model, folder.with_name(folder.name + "-source"))
    return write_official(source.parent, folder, shards=shards)


def memory_status(key: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM, RssAnon, RssFile); the field must be there."""
    value = process_memory(key)
    assert value is not None, f"/proc/self/status has no {key}"
    return value


def restart_peak() -> None:
    """Restart VmHWM (the resident set's high-water mark) at the current VmRSS: writing 5 to clear_refs does it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:   # not Linux, or not allowed: the peak then counts from the process's start (a looser bound)
        pass

