"""The shard index model.safetensors.index.json: read within a size limit, a 'weight_map' of tensor names to
shard files that all lie inside the checkpoint folder."""
from __future__ import annotations

from pathlib import Path

from ..spec.json_file import read_json_file
from .errors import CheckpointError
from .paths import shard_inside

MAX_INDEX_BYTES = 32 << 20   # an index of all 95,819 tensors of V4.1-Flash takes ~8 MiB
MAX_SHARDS = 10_000          # releases ship 48 (V4-Flash) to 163 (V3) shards; each named shard is looked at


def read_weight_map(index: Path) -> dict[str, str]:
    """tensor name → shard file name, checked: a JSON object with a 'weight_map' object of strings, every shard
    inside the index's folder (paths.shard_inside). CheckpointError naming the index and the problem."""
    raw = read_json_file(index, "shard index", MAX_INDEX_BYTES, CheckpointError)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{index}: not a safetensors index: it is a JSON {type(raw).__name__}, not an object "
                              "with a 'weight_map'")
    if "weight_map" not in raw:
        raise CheckpointError(f"{index}: not a safetensors index: it has no 'weight_map' (tensor name → shard file)")
    weight_map = raw["weight_map"]
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: 'weight_map' must be a non-empty object mapping tensor names to shard "
                              f"files, got {type(weight_map).__name__} {str(weight_map)[:40]}")
    bad = [name for name, shard in weight_map.items() if not isinstance(shard, str)]
    if bad:
        raise CheckpointError(f"{index}: 'weight_map' maps '{bad[0]}' to {str(weight_map[bad[0]])[:40]}; each tensor "
                              "must map to a shard file name")
    shards = set(weight_map.values())
    if len(shards) > MAX_SHARDS:
        raise CheckpointError(f"{index}: 'weight_map' names {len(shards):,} shard files, more than the "
                              f"{MAX_SHARDS:,} this engine opens")
    for shard in shards:
        shard_inside(index.parent, shard, index)
    return weight_map
