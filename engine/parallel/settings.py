"""Generation settings every rank must share: refused where a rank could take other steps, seeds agreed by rank 0."""
from __future__ import annotations

import torch

from ..spec.errors import InputError
from .comm import broadcast_json


def lockstep_settings(kwargs: dict, world) -> dict:
    """The keywords of Engine.generate for a sharded model. Every rank runs the same loop and must take the
    same branch at every step: CUDA graphs are refused (single-process for now), and an unseeded sampling run
    gets rank 0's random seed, so that every rank draws the same tokens."""
    if kwargs.get("cuda_graphs") or kwargs.get("compiled"):
        raise InputError("cuda_graphs / compiled: graphed decoding runs in one process for now; a torchrun launch "
                         "decodes eagerly")
    if kwargs.get("seed") is None and float(kwargs.get("temperature", 0.0)) > 0:
        seed = broadcast_json(int(torch.randint(0, 2**31 - 1, ())), world.group, "the sampling seed", world.device)
        kwargs = {**kwargs, "seed": seed}
    return kwargs
