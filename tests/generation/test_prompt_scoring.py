"""A traced run scores its prompt inside its own prefill (Transformer.forward(prompt_logits=True)): no second pass
over the prompt, each prompt token's log-probability the teacher-forced one, and the generated text the untraced
run's, plain and with DSpark, greedy."""
from __future__ import annotations

import pytest
import torch

from engine.generation import DSparkConfig, generate, generate_speculative
from engine.model import transformer
from engine.request import GenerationRequest
from engine.trace import Trace
from tests.model_helpers import tiny_model

V = 64
PROMPT = [0, *torch.randint(3, V, (20,), generator=torch.Generator().manual_seed(7)).tolist()]   # 21 tokens


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float64, vocab_size=V, dspark_noise_token_id=V - 1)


def counted_run(model, dspark: bool, trace: Trace | None, chunk: int = 4096):
    """The run's result and the lengths of the target forwards it made."""
    widths = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(args[0].shape[1]), with_kwargs=True)
    try:
        request = GenerationRequest.of(5, stop_tokens=(), dspark=DSparkConfig("all") if dspark else None,
                                       trace=trace, prefill_chunk=chunk)
        return (generate_speculative if dspark else generate)(model, [PROMPT], request), widths
    finally:
        hook.remove()


@pytest.mark.slow  # four tiny float64 runs, two with DSpark, two traced [~2 s]
@pytest.mark.parametrize("dspark", [False, True])
def test_a_traced_run_scores_its_prompt_in_its_prefill(model, dspark, monkeypatch):
    monkeypatch.setattr(transformer, "PROMPT_LOGITS_VALUES", 3 * V)     # slices of 3 positions: bounded logits
    plain, plain_widths = counted_run(model, dspark, None, chunk=8)
    trace = Trace()
    traced, traced_widths = counted_run(model, dspark, trace, chunk=8)
    assert traced.tokens == plain.tokens
    assert traced_widths == plain_widths                                 # the prompt runs once: the prefill's chunks
    with torch.inference_mode():
        want = torch.log_softmax(model(torch.tensor([PROMPT]), logits="all").logits[0, :-1], -1)   # [20, V]
    prompt = [t for t in trace.tokens(0) if not t.generated]
    assert [t.token_id for t in prompt] == PROMPT
    got = torch.tensor([t.logprob for t in prompt[1:]], dtype=torch.float64)
    torch.testing.assert_close(got, want[torch.arange(len(PROMPT) - 1), PROMPT[1:]], atol=1e-5, rtol=1e-5)
