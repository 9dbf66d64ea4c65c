"""Generation settings every rank must share: refused where a rank could take other steps, seeds agreed by rank 0."""
from __future__ import annotations

import torch

from ..request import GenerationRequest
from ..spec.errors import InputError
from .comm import broadcast_json
from .world import World


def lockstep_settings(request: GenerationRequest, world: World) -> GenerationRequest:
    """The request Engine.generate runs on a sharded model. Every rank runs the same loop and must take the
    same branch at every step: CUDA graphs are refused (single-process for now), and an unseeded sampling run
    gets rank 0's random seed, so that every rank draws the same tokens."""
    if request.graphed:
        raise InputError("cuda_graphs / compiled: graphed decoding runs in one process for now; a torchrun launch "
                         "decodes eagerly")
    if request.sampling.seed is None and not request.sampling.greedy:
        seed = broadcast_json(int(torch.randint(0, 2**31 - 1, ())), world.group, "the sampling seed", world.device)
        request = request.with_sampling(seed=seed)
    return request
