"""The official checkpoint's folder (spec §2): shard names, the index, config.json with its quantization_config,
and the block each quantized tensor's scale covers. Torch-free: the app's model picker uses it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..spec.config import ModelArgs

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
QUANTIZED_CODES = ("F8_E4M3", "I8")     # stored with a companion `.scale` (E8M0)
ENGRAM_TABLE_SUFFIX = ".engram.embed.weight"
ENGRAM_BLOCK = (1, 32)                   # one scale per row and 32 channels
FP4_BLOCK = (1, 32)                      # one scale per row and 32 inputs
CONFIG_PEEK_BYTES = 4 << 20              # config.json files are a few KB; load_config reports a larger one


def shard_name(index: int, count: int) -> str:
    """The i-th (0-based) of `count` shards: model-00001-of-00048.safetensors, as the release names them."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def official_folder(path: str | Path) -> Path | None:
    """The folder of the official-format checkpoint that `path` names (the folder, its index or its config),
    or None for anything else. Official = its config.json declares a `quantization_config` (the release and
    `engine quantize` both write one); the project's own checkpoints never do."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if path.is_file() and path.name not in (INDEX_NAME, CONFIG_NAME, SINGLE_NAME):
        return None
    return folder if declares_quantization(folder / CONFIG_NAME) else None


def declares_quantization(config: Path) -> bool:
    """Whether a config.json (flat, or HF composite with text_config) has a quantization_config object."""
    try:
        if not config.is_file():  # nothing there, or a pipe or device that a read would block on
            return False
        with open(config, "rb") as f:
            data = f.read(CONFIG_PEEK_BYTES + 1)
        if len(data) > CONFIG_PEEK_BYTES:
            return False
        raw = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad UTF-8 or JSON
        return False  # no readable config: not recognisably official; the regular loader reports the problem
    if not isinstance(raw, dict):
        return False
    text = raw.get("text_config")
    return isinstance(raw.get("quantization_config"), dict) or (
        isinstance(text, dict) and isinstance(text.get("quantization_config"), dict))


def official_args(args: ModelArgs) -> ModelArgs:
    """The config whose tensor_inventory is the official layout of `args`' architecture: FP8 dense weights and
    Engram tables, MXFP4 routed experts (what `engine quantize` writes for any source precision)."""
    return args.replace(dtype="fp8", expert_dtype="fp4")


def official_config(args: ModelArgs) -> dict[str, Any]:
    """config.json of an official-format folder in the flat form: every ModelArgs field plus the release's
    quantization_config (spec §2.1), which engine.spec.config folds back into dtype / expert_dtype."""
    config = {k: v for k, v in args.to_dict().items() if k != "name"}
    config["quantization_config"] = {
        "quant_method": args.dtype, "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": args.scale_fmt,
        "weight_block_size": list(args.weight_block_size), "expert_dtype": args.expert_dtype}
    return config


def scale_name(weight_name: str) -> str:
    """`X.weight` → `X.scale` (spec §2.2: a quantized weight's E8M0 scale sits beside it)."""
    return weight_name.removesuffix(".weight") + ".scale"


def weight_name(scale: str) -> str:
    return scale.removesuffix(".scale") + ".weight"


def scale_block(name: str, code: str, args: ModelArgs) -> tuple[int, int]:
    """The [rows, cols] block of the weight `name` (stored as `code`) that one E8M0 scale covers."""
    if code == "I8":
        return FP4_BLOCK
    if name.endswith(ENGRAM_TABLE_SUFFIX):
        return ENGRAM_BLOCK
    return tuple(args.weight_block_size)
