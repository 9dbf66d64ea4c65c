"""Capture-safety proxy without a GPU: run the decode body on the meta device, where any host read fails."""
from __future__ import annotations

import numpy as np
import torch

from ..dspark.drafter_cache import DrafterCache
from ..model import Transformer
from ..spec.errors import InputError
from ..speedups import prepare_for_inference
from ..speedups.fast_moe import FastMoE
from .decode_body import decode_body
from .draft_body import DraftInputs, draft_body
from .static_inputs import DecodeInputs
from .trace_buffers import TraceBuffers


class CaptureUnsafeError(RuntimeError):
    """The decode body read a device value on the host (or built a value-dependent shape): it cannot be captured."""


def _meta_model(args, dtype, options):
    """`args`' Transformer on the meta device, prepared as for inference: shapes, no values (any Engram token
    map will do). Its MoEs never run densely, so that the proxy proves the gathered expert path: the one a
    full-size model's static body takes (a small model's dense path is two plain matmuls)."""
    token_map = np.zeros(args.vocab_size, dtype=np.int64) if args.has_engram else None
    model = prepare_for_inference(Transformer(args, token_map, dtype=dtype, device="meta", options=options))
    for module in model.modules():
        if isinstance(module, FastMoE):
            module.dense_ok = False
    return model


def check_capture_safe(args, *, batch: int = 2, max_seq_len: int = 64, dtype=torch.bfloat16, options=None,
                       trace: bool = True, body=decode_body, n_tokens: int = 1, logits: str = "last",
                       taps: bool = False) -> None:
    """Build `args`' model, cache and static buffers on the meta device (no values anywhere) and run `body`
    once. Meta tensors have shapes but no data, so `.item()`, `int(t)`, `.tolist()`, `.cpu()`, `.numpy()`,
    `bool(t)`, a value-sized `nonzero` — each of which would sync a CUDA stream and break capture — raise
    here; they become a CaptureUnsafeError naming the cause. A clean run is the CPU stand-in for "capturable".
    n_tokens / logits / taps: the step's shape (a DSpark verify block: n_tokens = γ + 1, "all", taps).
    """
    model = _meta_model(args, dtype, options)
    cache = model.new_cache(batch + 1, max_seq_len)
    inputs = DecodeInputs(model, batch, scratch_row=batch, n_tokens=n_tokens, logits=logits, taps=taps)
    roles = args.roles[: args.n_layers]
    sink = TraceBuffers((f"{r.path}.attn" for r in roles), (r.path for r in roles)) if trace else None   # (+ lens)
    try:
        with torch.inference_mode():
            body(model, cache, inputs, sink)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        raise CaptureUnsafeError(f"the decode body is not capture-safe: {type(e).__name__}: {e}") from e
    if not inputs.logits.is_meta:
        raise CaptureUnsafeError("the body's logits left the meta device")


def check_draft_capture_safe(args, *, batch: int = 2, dtype=torch.bfloat16, options=None, trace: bool = True,
                             greedy: bool = True, body=None) -> None:
    """check_capture_safe's sibling for the DSpark draft body (engine.graphs.draft_body): the model, the
    drafter rings and the static draft buffers on the meta device, the body run once (greedy: with the
    in-graph Markov argmax). A host read or value-sized shape anywhere raises CaptureUnsafeError."""
    if not args.has_dspark:
        raise InputError(f"config '{args.name or args.model_type}' has no DSpark drafter to check")
    body = draft_body if body is None else body
    model = _meta_model(args, dtype, options)
    rings = DrafterCache(model, batch + 1, margin=args.dspark_block_size + 1)
    inputs = DraftInputs(model, batch, scratch_row=batch, window=rings.window)
    sink = TraceBuffers() if trace else None
    try:
        with torch.inference_mode():
            body(model, rings, inputs, sink, greedy)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        raise CaptureUnsafeError(f"the draft body is not capture-safe: {type(e).__name__}: {e}") from e
    if not (inputs.base.is_meta and inputs.tokens.is_meta):
        raise CaptureUnsafeError("the draft body's outputs left the meta device")
