"""Tensor/expert parallelism on torch.distributed (torchrun; gloo on CPU, NCCL on GPU): a reference-model transform."""
from .load import build_shard, shard_for_launch
from .shard import Layout, Source, shard_model
from .world import DistributedError, World, is_main_process, join_world, launched_size, leave_world, main_rank_output

__all__ = ["DistributedError", "Layout", "Source", "World", "build_shard", "is_main_process", "join_world",
           "launched_size", "leave_world", "main_rank_output", "shard_for_launch", "shard_model"]
