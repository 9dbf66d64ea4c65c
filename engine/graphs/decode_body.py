"""decode_body: one single-token decode step as a pure function of static buffers (what a CUDA graph captures)."""
from __future__ import annotations

from ..model.context import ForwardContext
from .static_inputs import DecodeInputs


def decode_body(model, cache, inputs: DecodeInputs, trace=None) -> None:
    """Run every backbone layer for inputs' rows at their positions, reading and writing `cache`'s tensors
    in place, and write the last-position logits into inputs.logits. No host sync, no shape that depends
    on a value (ForwardContext.static), so the same launches replay for any positions. `trace`: a
    TraceBuffers that copies each record into its static buffer (or None). Host bookkeeping — the Engram
    history and hashing, cache.pos, room checks — is the caller's, before and after."""
    ctx = ForwardContext(cache=cache, rows=inputs.rows, start=inputs.positions[:, 0], n_tokens=1,
                         positions=inputs.positions, options=model.options, trace=trace, static=True)
    engram = None if inputs.engram_ids is None else (inputs.engram_ids, inputs.compressed)
    logits, _ = model.run_layers(inputs.tokens, ctx, engram, "last")     # [bucket, vocab]
    inputs.logits.copy_(logits)
