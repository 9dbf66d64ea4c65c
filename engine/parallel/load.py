"""Building a rank's shard: seeded random init of the full model, then slicing, or reading its parts of a checkpoint."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint.files import check_against, checkpoint_files, read_header
from ..checkpoint.finite import check_finite
from ..checkpoint.official_layout import official_folder
from ..model import Transformer, init_weights
from ..model.rope import Rotary
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..speedups import prepare_for_inference
from .shard import shard_model
from .world import World, join_world


@torch.inference_mode(False)   # ordinary tensors, whose version counters the speed paths read (track_versions)
def build_shard(args: ModelArgs, world: World, *, checkpoint: str | Path | None = None, token_map=None,
                seed: int = 0, dtype: torch.dtype = torch.float32, options=None) -> Transformer:
    """This rank's shard of the model `args` describes, in eval mode, on world.device.

    Without a checkpoint: the full model is built and seeded exactly as in one process (every tensor from its
    own named generator), then sliced, so every rank's parts are the single-process values. With a checkpoint
    in the project's safetensors layout: the model is built on the meta device, checked against the file
    header like a single-process load, sharded, allocated, and each tensor's part is read memory-mapped
    (safetensors get_slice): a rank never reads another rank's heads, experts or vocabulary rows."""
    if checkpoint is None:
        model = Transformer(args, token_map, dtype=dtype, device=world.device, options=options)
        init_weights(prepare_for_inference(model), seed)
        return shard_model(model, world).eval()
    if official_folder(checkpoint) is not None:
        raise InputError(f"{checkpoint}: official-format (FP8/FP4) checkpoints load in one process for now; a "
                         "torchrun launch reads the project's safetensors layout (engine train --export, or "
                         "save_checkpoint)")
    files = checkpoint_files(checkpoint)
    header = read_header(files)
    model = Transformer(args, token_map, dtype=dtype, device="meta", options=options)
    check_against(model.state_dict(), header, str(checkpoint))
    shard_model(prepare_for_inference(model), world)
    model.to_empty(device=world.device)
    for module in model.modules():  # to_empty leaves the non-persistent rotary frequencies unset
        if isinstance(module, Rotary):
            module.freqs = Rotary(*module.key, args, device=world.device).freqs
    read_shard(model, header)
    return model.eval()


def read_shard(model: Transformer, header: dict) -> None:
    """Fill a shard (shard_model's output) from the checkpoint whose read_header is `header`: per tensor only
    the rows or columns model.layout.source names, read from the memory-mapped file."""
    state, layout = model.state_dict(), model.layout
    by_file: dict[Path, list[str]] = {}
    for name in state:
        by_file.setdefault(header[layout.source(name).name][0], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    src = layout.source(name)
                    if src.dim is None:
                        part = f.get_tensor(src.name)
                    else:
                        rows = f.get_slice(src.name)
                        part = rows[src.start:src.stop] if src.dim == 0 else rows[:, src.start:src.stop]
                    check_finite(part, src.name, str(file))  # this rank's part: each rank checks what it reads
                    state[name].copy_(part)


def shard_for_launch(model: Transformer) -> Transformer:
    """A model built and filled alike on every rank: unchanged in a single-process run; under torchrun, this
    rank's shard (on its device)."""
    world = join_world(model.device)
    if world is None:
        return model
    return shard_model(model.to(world.device), world)
