"""What the parallel tests run alike in one process and on every rank: forwards, caches, a trace and generations."""
from __future__ import annotations

import numpy as np
import torch

from engine.dspark.config import DSparkConfig
from engine.generation import generate, generate_speculative
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget

PROMPTS = [[0, 5, 9, 100, 7], [0, 17]]


def ragged(tokens: list[list[int]]) -> torch.Tensor:
    """Rows of different lengths as one tensor: each row, then its length."""
    return torch.tensor([t for row in tokens for t in [*row, -len(row)]], dtype=torch.long)


def run_cases(model) -> dict[str, torch.Tensor]:
    return {**forward_cases(model), **generation_cases(model)}


@torch.inference_mode()
def forward_cases(model) -> dict[str, torch.Tensor]:
    """Name → tensor: prefill and decode logits, a multi-token chunk and its redo after a rollback, every cache's
    live state and the trace's numeric columns (attention facts included)."""
    g = torch.Generator().manual_seed(1)
    V = model.args.vocab_size
    out: dict[str, torch.Tensor] = {}
    trace = Trace(TraceBudget(max_tokens=None, attention=True))
    cache = model.new_cache(2, 48)
    out["prefill"] = model(torch.randint(0, V, (2, 7), generator=g), cache, trace=trace, logits="all").logits
    nxt = out["prefill"][:, -1].argmax(-1, keepdim=True)                    # [2, 1]
    for i in range(3):
        out[f"decode{i}"] = model(nxt, cache, trace=trace).logits
        nxt = out[f"decode{i}"].argmax(-1, keepdim=True)
    chunk = torch.randint(0, V, (2, 4), generator=g)
    out["chunk"] = model(chunk, cache, logits="all").logits
    cache.rollback(cache.pos - 2)
    out["redo"] = model(chunk[:, 2:], cache, logits="all").logits
    for row in range(2):
        for key, value in cache.live_state(row).items():
            out[f"cache{row}.{key}"] = value
    tables, _ = trace.to_tables()
    for table, columns in tables.items():
        for column, values in columns.items():
            if values.dtype.kind in "biuf":
                out[f"trace.{table}.{column}"] = torch.from_numpy(np.ascontiguousarray(values))
    return {k: v.contiguous() for k, v in out.items()}


def generation_cases(model) -> dict[str, torch.Tensor]:
    """Name → tokens of greedy, DSpark-greedy (with its accepted counts: drafts, verification and rollback of the
    drafter rings and target caches) and sampled generation."""
    spec = generate_speculative(model, PROMPTS, GenerationRequest.of(8, dspark=DSparkConfig()))
    return {"greedy": ragged(generate(model, PROMPTS, GenerationRequest.greedy(8)).tokens),
            "dspark": ragged(spec.tokens), "dspark.accepted": torch.tensor([s.accepted for s in spec.steps]),
            "sampled": ragged(generate(model, PROMPTS, GenerationRequest.of(6, temperature=0.9, seed=5)).tokens)}


@torch.inference_mode()
def teacher_forced_logits(model) -> torch.Tensor:
    """Logits [2, 12, V] (float32) of a fixed prefill of 8 tokens then 4 single-token decode steps, every input
    given: unlike forward_cases, no step feeds back an argmax, so a run in bf16, whose greedy choices may differ
    from another run's, is compared with it on the same inputs throughout."""
    tokens = torch.randint(0, model.args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(2, 24)
    out = [model(tokens[:, :8], cache, logits="all").logits]                 # [2, 8, V]
    out += [model(tokens[:, i:i + 1], cache, logits="all").logits for i in range(8, 12)]
    return torch.cat(out, 1).float()
