"""V4 checkpoints in the Hugging Face transformers layout (`DeepseekV4ForCausalLM.save_pretrained`): found by their
config.json, renamed to the official names (hf_names), checked name by name, then copied into the engine's model."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..spec import strict_json
from ..spec.config import ModelArgs, config_from_dict
from ..spec.errors import ConfigError
from ..spec.hf_config import is_hf_v4
from .errors import CheckpointError
from .files import check_index, checkpoint_files, read_header, stored_tensors
from .finite import check_finite
from .hf_names import from_hf
from .paths import existing

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
                       options=None) -> tuple[ModelArgs, "Transformer"]:
    """Build the model a transformers-layout V4 folder describes and fill it. Every tensor is renamed (stacked
    experts split into views, no copy), checked against the model (missing, unexpected, shape, dtype, NaN / Inf,
    hash-table ids outside the experts) before the first is copied; then the speed transforms its options ask for."""
    from ..model import Transformer
    from ..speedups import prepare_for_inference
    folder = hf_folder(existing(path))
    if folder is None:
        raise CheckpointError(f"{path}: not a transformers deepseek_v4 checkpoint (its {CONFIG_NAME} names no "
                              "layer_types)")
    try:
        args = config_from_dict(strict_json.loads(strict_json.read_capped(folder / CONFIG_NAME)), name=folder.name)
    except ConfigError as e:
        raise ConfigError(f"{folder / CONFIG_NAME}: {e}") from None
    files = checkpoint_files(folder)
    check_index(folder, read_header(files))
    stored = {name: (file, t) for file, name, t in stored_tensors(files)}     # memory-mapped views
    where = {name: str(file) for name, (file, _) in stored.items()}
    tensors = from_hf({name: t for name, (_, t) in stored.items()})
    model = Transformer(args, dtype=dtype, device=device, options=options)
    state = model.state_dict()
    _check(state, tensors, folder)
    for name, t in tensors.items():
        check_finite(t, name, where.get(name, str(folder)))
    with torch.no_grad():
        for name, t in tensors.items():
            state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
    return args, prepare_for_inference(model)


def _check(state: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], folder: Path) -> None:
    problems = []
    missing = [n for n in state if n not in tensors]
    extra = [n for n in tensors if n not in state]
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_few(missing)}")
    if extra:
        problems.append(f"unexpected {len(extra)} tensor(s): {_few(extra)}")
    for name, t in tensors.items():
        target = state.get(name)
        if target is None:
            continue
        if tuple(t.shape) != tuple(target.shape):
            problems.append(f"'{name}' has shape {list(t.shape)}, the model expects {list(target.shape)}")
        elif target.is_floating_point() != t.is_floating_point():
            problems.append(f"'{name}' is stored as {t.dtype}, the model expects {target.dtype}")
        elif name.endswith(".gate.tid2eid"):
            n_experts = state[name.removesuffix("tid2eid") + "weight"].size(0)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n_experts):
                problems.append(f"'{name}' names expert ids {int(t.min())}..{int(t.max())}, outside 0..{n_experts - 1}")
    if problems:
        raise CheckpointError(f"{folder} does not fit the model (official names shown): " + "; ".join(problems))


def _few(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(f"'{n}'" for n in names[:limit]) + more
