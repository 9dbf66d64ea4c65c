"""The card's decoding measurements: samples, DSpark against plain decoding per held-out prompt, greedy text quality."""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from ..dspark.config import DSparkConfig
from ..dspark.metrics import summarize
from ..request import GenerationRequest
from .text_quality import REPEAT_N, measure_ids, pooled

PROMPTS = ("ROMEO:", "JULIET:", "To be, or not to be", "KING HENRY:")  # the samples' prompts (fixed, any style)
# (key, temperature, with the decoding options): each a plain/DSpark comparison on the held-out prompts
DSPARK_RUNS = (("T=0", 0.0, False), ("T=1", 1.0, False), ("T=0, options", 0.0, True))


def decoding_options(opts) -> dict:
    """The card's decoding options (CardOptions' repetition_penalty and no_repeat_ngram) as generate keywords."""
    return {"repetition_penalty": opts.repetition_penalty, "no_repeat_ngram": opts.no_repeat_ngram}


def measure_samples(engine, opts) -> dict:
    """Seeded samples at the card's sample temperature from the fixed PROMPTS."""
    request = GenerationRequest.of(opts.new_tokens, seed=opts.seed, temperature=opts.sample_temperature)
    samples = engine.generate_text(list(PROMPTS), request)
    return {"samples": [{"prompt": p, "text": t} for p, t in zip(PROMPTS, samples.texts)],
            "sample_settings": {"temperature": opts.sample_temperature, "seed": opts.seed,
                                "max_new_tokens": opts.new_tokens}}


def decoded_tokens(result) -> int:
    """Tokens a run decoded after prefill (each row's first token comes from the prefill logits)."""
    return sum(max(len(t) - 1, 0) for t in result.tokens)


def rate(results) -> float:
    """Decoded tokens per second of decode over several runs together."""
    return sum(decoded_tokens(r) for r in results) / sum(r.decode_s for r in results)


def compare_prompts(engine, ids: list[list[int]], temperature: float, extra: dict, opts) -> dict:
    """Plain and DSpark decoding of each prompt alone (batch 1, as `generate --prompt` runs), repeated with the
    order alternating (a busy machine slows both alike): the pooled row and one row per prompt."""
    plain_request = GenerationRequest.of(opts.new_tokens, seed=opts.seed, stop_tokens=(), temperature=temperature,
                                         **extra)
    requests = {False: plain_request, True: replace(plain_request, dspark=DSparkConfig())}
    runs: dict[bool, list[list]] = {False: [], True: []}            # per repeat: one result per prompt
    for rep in range(opts.repeats):
        for spec in ((False, True) if rep % 2 == 0 else (True, False)):
            runs[spec].append([engine.generate([p], requests[spec]) for p in ids])
    plain, spark = runs[False][-1], runs[True][-1]                    # seeded: every repeat has the same tokens
    ratios = [rate(d) / rate(p) for p, d in zip(runs[False], runs[True])]  # one pooled pair per repeat
    plain_rate = statistics.median(rate(r) for r in runs[False])
    spark_rate = statistics.median(rate(r) for r in runs[True])
    m = summarize([s for r in spark for s in r.steps])
    per_prompt = []
    for i in range(len(ids)):
        each = [rate([d[i]]) / rate([q[i]]) for q, d in zip(runs[False], runs[True])]
        per_prompt.append({"steps": len(spark[i].steps),
                           "mean_accepted_length": summarize(spark[i].steps).mean_accepted_length,
                           "speedup": statistics.median(each), "speedup_range": [min(each), max(each)],
                           "outputs_identical": plain[i].tokens == spark[i].tokens})
    return {"mean_accepted_length": m.mean_accepted_length, "acceptance_rate": m.acceptance_rate,
            "per_position_acceptance": m.conditional_acceptance, "dspark_steps": m.steps,
            "decoded_tokens": sum(decoded_tokens(r) for r in spark),
            "plain_tokens_per_s": plain_rate, "dspark_tokens_per_s": spark_rate,
            "speedup": spark_rate / plain_rate, "speedup_range": [min(ratios), max(ratios)],
            "outputs_identical": [r.tokens for r in plain] == [r.tokens for r in spark],
            "temperature": temperature, **extra, "per_prompt": per_prompt}


def measure_dspark(engine, prompts: list[str], opts) -> dict | None:
    """Plain vs DSpark on the held-out prompts: at T = 0 and T = 1 with the engine's defaults, and at T = 0 with
    the decoding options (lossless there too). None for a model without a drafter."""
    if not engine.args.has_dspark:
        return None
    ids = [engine.encode(p) for p in prompts]
    engine.generate(ids[:1], GenerationRequest.of(2, stop_tokens=()))       # warm-up
    out = {"prompts": list(prompts), "batch": 1, "repeats": opts.repeats, "new_tokens": opts.new_tokens,
           "threads": torch.get_num_threads()}
    for key, temperature, with_options in DSPARK_RUNS:
        out[key] = compare_prompts(engine, ids, temperature, decoding_options(opts) if with_options else {}, opts)
    return out


def greedy_quality(engine, prompts: list[str], new_tokens: int, known: set[str] | None = None,
                   **options) -> tuple[dict, list[dict]]:
    """Greedy continuations of the prompts (one batch, each ending at EOS or after new_tokens) under the decoding
    options (generate keywords): their pooled text-quality measures and one row per prompt, with its text.
    known: the training text's words (engine.training.text_quality.words_of), for the known-word share."""
    tok = engine.tokenizer
    result = engine.generate([engine.encode(p) for p in prompts], GenerationRequest.of(new_tokens, **options))
    rows = [{"prompt": p, **measure_ids(tok, ids, known), "text": tok.decode(ids)}
            for p, ids in zip(prompts, result.tokens)]
    return pooled(rows), rows


def measure_text_quality(engine, prompts: list[str], opts, known: set[str] | None = None) -> dict:
    """The held-out prompts' greedy continuations measured without and with the decoding options."""
    runs = {}
    for name, options in (("off", {}), ("options", decoding_options(opts))):
        summary, rows = greedy_quality(engine, prompts, opts.quality_tokens, known, **options)
        runs[name] = {"repetition_penalty": options.get("repetition_penalty", 1.0),
                      "no_repeat_ngram": options.get("no_repeat_ngram", 0), **summary, "per_prompt": rows}
    return {"prompts": list(prompts), "new_tokens": opts.quality_tokens, "ngram": REPEAT_N,
            "known_words": "words of the training text" if known is not None else None, "runs": runs}
