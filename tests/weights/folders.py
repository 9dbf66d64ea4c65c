"""Checkpoint folders for the weights tests: the shipped model in the official layout (4 shards, written once per
module in ~0.5 s by `engine quantize`'s writer), a copy of it to damage, and V4's hash-routed tiny config."""
from __future__ import annotations

import shutil
from pathlib import Path

from engine.checkpoint.official_layout import shard_name
from engine.checkpoint.official_writer import write_official
from engine.spec.config import load_config
from tests.official_helpers import DEFAULT, write_tiny_official

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 4


def shipped_official(folder: Path) -> Path:
    """The shipped default model (its trained weights) converted to the official layout in SHARDS shards."""
    return write_official(DEFAULT, folder, shards=SHARDS).folder


def copy_of(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def without_shard(folder: Path, to: Path, which: int = 1) -> tuple[Path, str]:
    """A copy of `folder` with shard `which` (0-based) deleted: a partial download."""
    copy_of(folder, to)
    name = shard_name(which, SHARDS)
    (to / name).unlink()
    return to, name


def tiny_v4_official(folder: Path) -> Path:
    """V4's tiny config (two hash-routed layers, FP8 / FP4) at a 512-token vocabulary, initialised and quantized."""
    args = load_config(ROOT / "configs" / "tiny-v4.json").replace(vocab_size=512, dspark_noise_token_id=500)
    return write_tiny_official(folder, args, shards=2).folder
