"""decode_body: one decode (or verify) step as a pure function of static buffers (what a CUDA graph captures)."""
from __future__ import annotations

from ..model.interventions import NONE
from ..speedups import sync_free
from .static_context import StaticContext
from .static_inputs import DecodeInputs


def decode_body(model, cache, inputs: DecodeInputs, trace=None) -> None:
    """Run every backbone layer for inputs' rows at their positions (S tokens per row: 1 for decode, anchor
    + drafts for a DSpark verify), reading and writing `cache`'s tensors in place, and write the logits
    (and taps) into inputs' buffers. No host sync and no shape that depends on a value
    (StaticContext), so the same launches replay for any positions. `trace`: a TraceBuffers that
    copies each record into its static buffer (or None). Host bookkeeping — the Engram history and
    hashing, cache.pos, room checks — is the caller's, before and after. The speed paths run sync-free
    (engine.speedups.sync_free: experts dense or gathered at any batch, Sinkhorn in torch)."""
    ctx = StaticContext(cache=cache, rows=inputs.rows, start=inputs.positions[:, 0], n_tokens=inputs.n_tokens,
                        positions=inputs.positions, options=model.options, trace=trace,
                        interventions=NONE)  # named here: torch.compile cannot trace a dataclass default object
    engram = None if inputs.engram_ids is None else (inputs.engram_ids, inputs.compressed)
    with sync_free():
        logits, taps = model.run_layers(inputs.tokens, ctx, engram, inputs.logits_mode)  # [bucket, (S,) vocab]
    inputs.logits.copy_(logits)
    if inputs.taps is not None:
        inputs.taps.copy_(taps)
