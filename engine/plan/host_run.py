"""The memory plan's figure for a one-process run whose device is the host's CPU (no torch).

Why a second figure: engine.plan.memory_plan places a deployment on GPUs, with BF16 activations and the
release's FP8 / FP4 cache rows. A CPU run of the engine holds its float tensors and caches in float32 (the
compute dtype: the CPU has no fast BF16 matmul here), so with "GPU" = CPU its peak is the plan's GPU part in the
engine's formats plus the host part (the Engram pages a context touches). scripts/rehearsal.py compares it
with the measured peak RSS."""
from __future__ import annotations

from math import ceil
from typing import TYPE_CHECKING

from .memory_fit import resident_bytes
from .memory_plan import Hardware, engram_touched, host_tensor_sizes, working_terms

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

BF16_TERMS = ("residual streams", "attention", "expert intermediates")   # working terms the plan counts in BF16
HEAD_TERM = "logits and fp32 head"


def host_run_bytes(args: "ModelArgs", context: int, batch: int = 1, value_bytes: int = 4,
                   prefill_chunk: int = Hardware.prefill_chunk) -> dict[str, int]:
    """Bytes of a CPU run that prefills `context` tokens in chunks of `prefill_chunk` (the engine's default,
    engine.request.PREFILL_CHUNK, is the plan's), by part, and their total: the weights as the
    lazy official loader holds them (FP8 / FP4 as stored, other floats in the compute dtype, Engram tables left in
    the shards), the engine's caches in the compute dtype (window ring per backbone layer, compressed KV and index
    keys per source, token history), the plan's working terms (its BF16 ones at value_bytes; no runtime reserve),
    the Engram pages touched and the plan's loading staging (twice the largest tensor). The plan's "fp32 head"
    term counts the logits only: the CPU engine reads its fp32 head in place (decode steps and DSpark blocks through
    engine.speedups.row_invariant's kernel, prefills through torch's matmul), with no second copy of it as a GPU
    keeps (where the kernel did not build, engine.speedups.fast_head makes a transposed one)."""
    a = args
    hw = Hardware(gpus=1, context=context, batch=batch, prefill_chunk=prefill_chunk, reserve_gib=0.0)
    working = working_terms(a, hw)
    working = {k: v * value_bytes // 2 if k in BF16_TERMS else v for k, v in working.items()}
    working[HEAD_TERM] -= a.vocab_size * a.dim * 4                  # no fp32 copy of the head on the CPU
    caches = 0
    for role in a.roles[: a.n_layers]:
        caches += a.window_size * a.head_dim
        if role.kv_mode == "own":
            rows = ceil(context / role.ratio) + 1
            caches += rows * a.head_dim + (rows * a.index_head_dim if role.indexer == "own" else 0)
    parts = {"weights": resident_bytes(a, value_bytes, official=True),
             "caches": batch * caches * value_bytes + (batch * context * 8 if a.has_engram else 0),
             "working": sum(working.values()),
             "engram_touched": engram_touched(a, context, batch),
             "staging": 2 * host_tensor_sizes(a)[1]}
    return {**parts, "total": sum(parts.values())}
