"""V4 checkpoints in the Hugging Face transformers layout (`DeepseekV4ForCausalLM.save_pretrained`): found by their
config.json, renamed to the official names (hf_names), checked name by name, then copied into the engine's model."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..placement import build_model, prepare_model
from ..spec import strict_json
from ..spec.config import ModelArgs, config_from_dict
from ..spec.errors import ConfigError
from ..spec.hf_config import is_hf_v4
from .errors import CheckpointError
from .files import check_against, check_index, checkpoint_files, read_header, stored_tensors
from .finite import check_finite
from .hf_names import from_hf
from .paths import existing
from .table_range import check_table_range

if TYPE_CHECKING:
    from ..model import Transformer

CONFIG_NAME = "config.json"


def hf_folder(path: str | Path) -> Path | None:
    """The folder of a transformers-layout V4 checkpoint that `path` names (the folder or a file in it), else None."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    config = folder / CONFIG_NAME
    try:
        raw = strict_json.loads(strict_json.read_capped(config)) if config.is_file() else None
    except (OSError, ConfigError):
        return None  # no readable config: not recognisably this layout; the regular loader reports the problem
    return folder if isinstance(raw, dict) and is_hf_v4(raw) else None


def load_hf_checkpoint(path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32,
                       token_map=None, options=None, config: ModelArgs | None = None
                       ) -> tuple[ModelArgs, "Transformer"]:
    """Build the model a transformers-layout V4 folder describes (config: its config.json unless given) and fill
    it. Every tensor is renamed (stacked experts split into views, no copy), checked against the model (missing,
    unexpected, shape, dtype, NaN / Inf, hash-table ids outside the experts) before the first is copied; then the
    speed transforms its options ask for.

    transformers has no drafter and saves no `mtp.*` weights, while its config keeps the release's
    `num_nextn_predict_layers`: a folder without them builds the backbone alone (ModelArgs.without_drafter), and
    the returned config says so (no draft stages); Engine.load tells the user the drafter is absent."""
    folder = hf_folder(existing(path))
    if folder is None:
        raise CheckpointError(f"{path}: not a transformers deepseek_v4 checkpoint (its {CONFIG_NAME} names no "
                              "layer_types)")
    args = config if config is not None else hf_config(folder)
    files = checkpoint_files(folder)
    check_index(folder, read_header(files))
    stored = {name: (file, t) for file, name, t in stored_tensors(files)}     # memory-mapped views
    where = {name: str(file) for name, (file, _) in stored.items()}
    tensors = from_hf({name: t for name, (_, t) in stored.items()})
    if args.n_draft_stages and not any(name.startswith("mtp.") for name in tensors):
        args = args.without_drafter()
    model = build_model(args, token_map, dtype=dtype, device=device, options=options)   # experts placed (options)
    state = model.state_dict()
    found = {name: (folder, t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    check_against(state, found, f"{folder} (official names shown)", compatible=same_kind)
    for name, t in tensors.items():
        check_finite(t, name, where.get(name, str(folder)))
        check_table_range(state, name, t, where.get(name, str(folder)))
    with torch.no_grad():
        for name, t in tensors.items():
            state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
    return args, prepare_model(model)


def hf_config(folder: Path) -> ModelArgs:
    """The config.json of a transformers-layout folder, read into ModelArgs (ConfigError names the file)."""
    try:
        return config_from_dict(strict_json.loads(strict_json.read_capped(folder / CONFIG_NAME)), name=folder.name)
    except ConfigError as e:
        raise ConfigError(f"{folder / CONFIG_NAME}: {e}") from None


def same_kind(stored: torch.dtype, wanted: torch.dtype) -> bool:
    """transformers may store an integer table in another width (an I32 `tid2eid` for the model's I64 buffer):
    floats take floats, integers integers."""
    return stored.is_floating_point == wanted.is_floating_point
