"""Plain generation: prefill each prompt into its cache row, then batched decode with per-row positions."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ..graphs import GraphedDecoder, cache_length_for
from ..model.sampling import apply_history_rules, check_finite_logits, draw, make_generators, probabilities
from ..model.transformer import Transformer
from ..request import GenerationRequest
from ..spec.errors import InputError
from .results import Emitter, GenerationResult, OnToken, check_prompts, elapsed, row_seeds, run_interventions


@torch.inference_mode()
def generate(model: Transformer, prompts: Sequence[Sequence[int]], request: GenerationRequest, *,
             on_token: OnToken | None = None, token_text: Callable[[int], str] | None = None) -> GenerationResult:
    """Generate up to request.max_new_tokens per prompt. Row i samples with seed + i (or seed[i]), so a prompt's
    output does not depend on its batch companions. token_text labels tokens in the trace; on_token(row, token,
    info) hears of each token as it is committed. request.cuda_graphs: decode steps go through an
    engine.graphs.GraphedDecoder (CUDA graphs per batch bucket on a GPU; on the CPU the same static body runs
    eagerly); request.compiled: that decoder's untraced steps run torch.compile'd (engine.graphs.compiled_body;
    minutes of compiling first, then several times faster on a CPU, equal up to float rounding); prefill stays
    eager. request.interventions: what-if changes (engine.request.interventions) applied to every forward of the run
    and recorded in the trace's meta. The sampling's repetition_penalty / no_repeat_ngram (1 / 0 = off):
    engine.model.sampling.apply_history_rules over each row's prompt + tokens so far, before the choice (greedy or
    sampled)."""
    max_new_tokens, params, trace = request.max_new_tokens, request.sampling, request.trace
    args = model.args
    interventions = run_interventions(model, request.interventions, trace, graphed=request.graphed)
    if any(iv.kind == "drop-stage" for iv in interventions.items):
        raise InputError("intervention 'drop-stage' changes the DSpark drafter, which plain decoding does not run: "
                         "decode with DSpark, or leave it out")
    prompts = check_prompts(prompts, args.vocab_size, args.max_seq_len)
    n = len(prompts)
    seeds = row_seeds(params.seed, n)
    device = next(model.parameters()).device
    generators = make_generators(seeds, device)
    max_len = min(args.max_seq_len, max(len(p) for p in prompts) + max_new_tokens)
    # with graphs, one extra cache row takes the padding rows of a batch bucket
    graphed = request.graphed
    if request.compiled:  # a bucketed length: later runs of nearby lengths reuse the compiled graphs
        max_len = cache_length_for(max_len, args.max_seq_len)
    cache = model.new_cache(n + 1 if graphed else n, max_len)
    decoder = None
    if graphed:
        decoder = GraphedDecoder(model, cache, scratch_row=n, compile=request.compiled)
    result = GenerationResult.for_prompts(prompts)
    out = Emitter(result, max_new_tokens, args.max_seq_len, request.stop_tokens, trace, token_text, on_token)

    # Prefill: each prompt alone into its own cache row, so no padding enters any computation; a prompt longer than
    # request.prefill_chunk in consecutive chunks, so that its activations stay those of one chunk.
    last_logits, last_time = [], []
    for row, ids in enumerate(prompts):
        out.record_prompt(row, ids)  # with a trace: the prefill scores each prompt token (prompt_logits)
        t0 = time.perf_counter()
        for start in range(0, len(ids), request.prefill_chunk):   # consecutive chunks through the same cache
            part = ids[start:start + request.prefill_chunk]
            logits = model(torch.tensor([part], device=device), cache, rows=torch.tensor([row], device=device),
                           trace=trace, logits="last", interventions=interventions,
                           prompt_logits=True).logits                            # [1, V]
        last_time.append(elapsed(t0, device))
        last_logits.append(logits)
    result.prefill_s = sum(last_time)
    if max_new_tokens == 0:
        result.finish_reasons = ["length"] * n
        return result

    active = list(range(n))
    logits = torch.cat(last_logits)  # [n, V]
    times = last_time
    for step in range(max_new_tokens):
        # a step's time: choosing the tokens (the check, the history rules, the draw, the host read) and the forward
        # that follows; a DSpark step's time covers its verifier's choice too, so both clocks count the same work
        t0 = time.perf_counter()
        check_finite_logits(logits, lambda i: f"at step {step} (row {active[i]}, choosing the token at position "
                                              f"{len(prompts[active[i]]) + len(result.tokens[active[i]])})")
        scores = apply_history_rules(logits, [prompts[r] + result.tokens[r] for r in active], params) \
            if params.uses_history else logits                                 # [A, V]
        if params.greedy:
            chosen, probs = scores.argmax(-1).tolist(), [1.0] * len(active)
        else:
            dist = probabilities(scores, params)  # [A, V]
            picked = draw(dist, [generators[r] for r in active])
            chosen, probs = picked.tolist(), dist.gather(-1, picked[:, None]).squeeze(-1).tolist()
        choice_s = time.perf_counter() - t0
        still = []
        for i, row in enumerate(active):
            pos = len(prompts[row]) + len(result.tokens[row])
            if out.emit(row, pos, chosen[i], step, times[i], logits[i], probs[i]):
                still.append(row)
        active = still
        if not active:
            break
        # Decode: the last token of every unfinished row, each at its own position.
        t0 = time.perf_counter()
        if decoder is not None:
            logits = decoder.step(torch.tensor([[result.tokens[r][-1]] for r in active]), active, trace).logits
        else:
            last = torch.tensor([[result.tokens[r][-1]] for r in active], device=device)  # [A, 1]
            logits = model(last, cache, rows=torch.tensor(active, device=device), trace=trace, logits="last",
                           interventions=interventions).logits
        dt = choice_s + elapsed(t0, device)
        result.step_times.append(dt)
        result.decode_s += dt
        times = [dt] * len(active)
    return result

