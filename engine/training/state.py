"""Training checkpoints: model (engine safetensors), AdamW moments (safetensors by parameter name), step (JSON)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..checkpoint.store import load_weights, save_checkpoint
from ..spec.errors import InputError, MissingFileError

OPTIMIZER_NAME = "optimizer.safetensors"
STATE_NAME = "train_state.json"


def save_training_state(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        names: dict[int, str], state: dict, metadata: dict[str, str]) -> None:
    """Write model.safetensors + config.json, optimizer.safetensors and train_state.json into `out`.
    train_state.json is written last (atomically): a run is resumable from `out` once it exists."""
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, out, extra_metadata=metadata)                       # fp32: resume is exact
    tensors = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                t = value if torch.is_tensor(value) else torch.tensor(float(value))
                tensors[f"{key}/{names[id(p)]}"] = t.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(out / OPTIMIZER_NAME), metadata={"format": "v41viz-adamw/1"})
    tmp = out / (STATE_NAME + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / STATE_NAME)


def load_training_state(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        names: dict[int, str]) -> dict:
    """Restore model weights and AdamW moments saved by save_training_state; returns train_state.json."""
    path = out / STATE_NAME
    if not path.is_file():
        raise MissingFileError(f"{out}: nothing to resume ({STATE_NAME} is missing); drop --resume to start afresh")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a readable training state ({e})") from None
    load_weights(model, out)
    saved = load_file(str(out / OPTIMIZER_NAME))
    by_name = {names[id(p)]: p for group in optimizer.param_groups for p in group["params"]}
    restored: dict[torch.Tensor, dict] = {}
    for key, t in saved.items():
        field, _, name = key.partition("/")
        if name not in by_name:
            raise InputError(f"{out / OPTIMIZER_NAME}: optimizer state for '{name}', which is not a trained "
                             "parameter of this model (different config?)")
        restored.setdefault(by_name[name], {})[field] = t
    # parameters that never received a gradient (e.g. indexer weights, which only select) have no moments
    optimizer.state.clear()
    for p, moments in restored.items():
        optimizer.state[p] = {k: v.to(p.device) if k != "step" else v for k, v in moments.items()}
    return state


def export_checkpoint(run_dir: Path, model: torch.nn.Module, dest: Path, metadata: dict[str, str]) -> Path:
    """The shippable checkpoint: bf16 weights (the official F32 tensors stay F32) + config.json, with the
    run's id_map.json and log.csv beside them; no optimizer state. Returns the weights file."""
    file = save_checkpoint(model, dest, extra_metadata=metadata, dtype="bf16")
    for name in ("id_map.json", "log.csv"):
        if (run_dir / name).is_file() and (run_dir / name).resolve() != (dest / name).resolve():
            shutil.copyfile(run_dir / name, dest / name)
    return file
