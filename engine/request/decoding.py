"""Decoding options against degenerate greedy text (runs of whitespace, a line repeated): the values the app and the
card suggest, and their wording. Torch-free, so pages that only show a trace's settings import no torch."""
from __future__ import annotations

# Off in the engine; the app's defaults and the model card's "with options" rows. Chosen by measurement on the shipped
# model (scripts/decoding_sweep.py, README "The default model"): 1.4 is the smallest penalty tried whose greedy text
# is no more repetitive than the held-out text itself (fewer repeated 4-grams, no whitespace run, no continuation with
# fewer words); larger ones push the model further from its own distribution. A no-repeat n-gram size adds little on
# top and blocks a speaker's heading from coming back.
SUGGESTED_REPETITION_PENALTY = 1.4
SUGGESTED_NO_REPEAT_NGRAM = 0


def option_phrases(repetition_penalty: float = 1.0, no_repeat_ngram: int = 0) -> list[str]:
    """The decoding options that are on, in words: ['repetition penalty 1.4', 'no repeated 4-grams'] (none: [])."""
    phrases = []
    if repetition_penalty != 1.0:
        phrases.append(f"repetition penalty {repetition_penalty:g}")
    if no_repeat_ngram:
        phrases.append(f"no repeated {no_repeat_ngram}-grams")
    return phrases
