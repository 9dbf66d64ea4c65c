"""Chunked prefill (GenerationRequest.prefill_chunk): a prompt longer than the chunk runs in consecutive forwards
through the same caches, and the run is the one-shot run's: the same greedy tokens and logits up to float rounding,
plain and with DSpark, and the same trace records (every prompt position once, the same experts chosen)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.generation import DSparkConfig, generate, generate_speculative
from engine.request import GenerationRequest
from engine.spec.errors import InputError
from engine.trace import Trace
from tests.model_helpers import tiny_model

V = 64
PROMPT = [0, *torch.randint(3, V, (37,), generator=torch.Generator().manual_seed(5)).tolist()]   # 38 tokens


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float64, vocab_size=V, dspark_noise_token_id=V - 1)


def run(model, chunk: int, dspark: bool = False, trace: Trace | None = None):
    request = GenerationRequest.of(6, stop_tokens=(), dspark=DSparkConfig("all") if dspark else None, trace=trace,
                                   prefill_chunk=chunk)
    return (generate_speculative if dspark else generate)(model, [PROMPT], request)


@pytest.mark.slow  # four tiny runs, two of them traced [~2-3 s each]
@pytest.mark.parametrize("chunk", [5, 16])    # 5: chunks that end inside the compressors' blocks of 4
def test_a_chunked_prefill_generates_what_one_forward_does(model, chunk):
    whole, parts = run(model, 4096), run(model, chunk)
    assert parts.tokens == whole.tokens
    whole_trace, parts_trace = Trace(), Trace()
    run(model, 4096, trace=whole_trace)
    run(model, chunk, trace=parts_trace)
    generated = [(t.pos, t.token_id, t.top_ids.tolist()) for t in whole_trace.tokens() if t.generated]
    assert [(t.pos, t.token_id, t.top_ids.tolist()) for t in parts_trace.tokens() if t.generated] == generated
    logits = np.stack([t.top_logits for t in whole_trace.tokens() if t.generated])          # [6, top-k]
    np.testing.assert_allclose(np.stack([t.top_logits for t in parts_trace.tokens() if t.generated]), logits,
                               rtol=1e-5, atol=1e-6)   # the trace keeps float32 top logits
    moe_whole, moe_parts = whole_trace.moe_table(), parts_trace.moe_table()
    assert moe_whole.keys() == moe_parts.keys()
    for key in moe_whole:
        if moe_whole[key].dtype.kind == "f":
            np.testing.assert_allclose(moe_parts[key], moe_whole[key], rtol=1e-5, atol=1e-6)
        else:                                                        # layer paths, rows, positions, expert ids
            np.testing.assert_array_equal(moe_parts[key], moe_whole[key])


@pytest.mark.slow  # three tiny runs, two with DSpark [~1.5 s]
def test_a_chunked_prefill_drafts_as_one_forward_does(model):
    whole, parts = run(model, 4096, dspark=True), run(model, 7, dspark=True)
    assert parts.tokens == whole.tokens == run(model, 4096).tokens
    assert parts.metrics.accepted == whole.metrics.accepted


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True, "64"])
def test_a_bad_prefill_chunk_is_refused_by_name(chunk):
    with pytest.raises(InputError, match="prefill_chunk must be a positive number of tokens"):
        GenerationRequest.of(4, prefill_chunk=chunk)
