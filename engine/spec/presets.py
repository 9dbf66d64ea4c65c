"""The configs shipped in configs/, and one resolver from a path or preset name to ModelArgs (no torch)."""
from __future__ import annotations

from pathlib import Path

from .config import ModelArgs, load_config
from .errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def list_presets() -> dict[str, Path]:
    """Config files shipped in configs/, by file stem."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.json"))}


def resolve_config(spec: str) -> ModelArgs:
    """A path to a config file, or the stem of a preset in configs/."""
    path = Path(spec)
    presets = list_presets()
    if path.is_file() or (spec not in presets and (path.suffix == ".json" or "/" in spec)):
        return load_config(path)  # a missing path raises ConfigError "cannot read config (...)"
    if spec in presets:
        return load_config(presets[spec])
    raise ConfigError(f"'{spec}' is neither a config file nor a preset; presets: {', '.join(presets)}")
