"""Building a rank's shard: seeded random init of the full model, then slicing, or reading its parts of a checkpoint
(the project's safetensors layout or the official FP8 / MXFP4 one)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint.errors import CheckpointError
from ..checkpoint.files import check_against, checkpoint_files, read_header
from ..checkpoint.finite import check_finite
from ..checkpoint.official import OfficialCheckpoint
from ..checkpoint.official_layout import official_folder
from ..checkpoint.official_load import fill_official, plan_load
from ..model import Transformer, init_weights
from ..placement.allocate import allocate
from ..quant.apply import quantize_model
from ..spec.config import ModelArgs
from ..spec.errors import EngineError
from ..speedups import prepare_for_inference
from .comm import all_gather_text
from .shard import shard_model
from .world import DistributedError, World, join_world


@torch.inference_mode(False)   # ordinary tensors, whose version counters the speed paths read (track_versions)
def build_shard(args: ModelArgs, world: World, *, checkpoint: str | Path | None = None, token_map=None,
                seed: int = 0, dtype: torch.dtype = torch.float32, options=None) -> Transformer:
    """This rank's shard of the model `args` describes, in eval mode, on world.device.

    Without a checkpoint: the full model is built and seeded exactly as in one process (every tensor from its
    own named generator), then sliced, so every rank's parts are the single-process values. With a checkpoint
    in the project's safetensors layout: the model is built on the meta device, checked against the file
    header like a single-process load, sharded, allocated, and each tensor's part is read memory-mapped
    (safetensors get_slice): a rank never reads another rank's heads, experts or vocabulary rows. With an
    official-format (FP8 / MXFP4) folder: the same, with the weights kept quantized (build_official_shard)."""
    if checkpoint is None:
        model = Transformer(args, token_map, dtype=dtype, device=world.device, options=options)
        init_weights(prepare_for_inference(model), seed)
        return shard_model(model, world).eval()
    if official_folder(checkpoint) is not None:
        return build_official_shard(args, world, checkpoint, token_map=token_map, dtype=dtype, options=options)
    files = checkpoint_files(checkpoint)
    header = read_header(files)
    model = Transformer(args, token_map, dtype=dtype, device="meta", options=options)
    check_against(model.state_dict(), header, str(checkpoint))
    shard_model(prepare_for_inference(model), world)
    allocate(model, world.device)   # storage, then the non-persistent rotary frequencies
    load_on_every_rank(world, lambda: read_shard(model, header), f"loading {checkpoint}")
    return model.eval()


@torch.inference_mode(False)
def build_official_shard(args: ModelArgs, world: World, checkpoint: str | Path, *, token_map=None,
                         dtype: torch.dtype = torch.float32, options=None) -> Transformer:
    """This rank's shard of an official-format checkpoint, with the weights kept as stored (FP8 + E8M0 blocks,
    packed MXFP4; engine.quant): built on the meta device, quantized there (quantize_model, no values),
    checked against the official layout (plan_load), split (shard_model: the FP8 linears keep their parts'
    scale blocks, the quantized MoE its experts), allocated, then filled with this rank's parts only
    (fill_official with the layout's sources: get_slice reads, the mapping reopened every few tensors). So a
    rank's memory is its share plus one reopen budget of mapped pages (OfficialCheckpoint.tensors). Host Engram
    tables stay in the shards: each rank attaches its own positioned-read sources (docs/parallelism.md)."""
    ckpt = OfficialCheckpoint(checkpoint)
    if args.dtype != "fp8":
        raise CheckpointError(f"{ckpt.folder}: an official-format checkpoint needs a config with dtype fp8 "
                              f"(its quantization_config), got dtype {args.dtype!r}")
    model = Transformer(args, token_map, dtype=dtype, device="meta", options=options)
    quantize_model(model, from_values=False)
    plan = plan_load(model, args)              # the whole model against the official layout
    shard_model(prepare_for_inference(model), world)
    allocate(model, world.device)
    load_on_every_rank(world, lambda: fill_official(model, ckpt, plan, args, model.layout.source),
                       f"loading {ckpt.folder}")
    return model.eval()


def load_on_every_rank(world: World, load: Callable[[], None], what: str) -> None:
    """Run load() on this rank, then learn how it went on every rank (one all-gather of their errors): if any
    failed (a missing or truncated shard, a tensor of the wrong shape, a NaN in its part), every rank raises the
    same CheckpointError, the first failed rank's, naming it and what its loader named (tensor and shard). A
    rank that failed alone would otherwise leave the others waiting in their first collective until the
    process group's timeout."""
    cause = None
    try:
        load()
    except DistributedError:   # the launcher is ending this rank: the others are gone or going
        raise
    except Exception as error:  # noqa: BLE001 - whatever stopped this rank must reach the ranks waiting for it
        cause = error
    failure = "" if cause is None else str(cause) if isinstance(cause, EngineError) else \
        f"{type(cause).__name__}: {cause}"
    failures = all_gather_text(failure, world.group, f"the outcome of {what}", world.device)
    failed = [r for r, text in enumerate(failures) if text]
    if failed:
        also = f" (rank{'s' if len(failed) > 2 else ''} {', '.join(map(str, failed[1:]))} failed too)" \
            if len(failed) > 1 else ""
        raise CheckpointError(f"rank {failed[0]} of {world.size} failed {what}{also}: {failures[failed[0]]}") \
            from cause


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
                    part = src.read(f)
                    check_finite(part, src.name, str(file))  # this rank's part: each rank checks what it reads
                    state[name].copy_(part)


def shard_for_launch(model: Transformer) -> Transformer:
    """A model built and filled alike on every rank: unchanged in a single-process run; under torchrun, this
    rank's shard (on its device)."""
    world = join_world(model.device)
    if world is None:
        return model
    return shard_model(model.to(world.device), world)
