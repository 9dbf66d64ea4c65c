"""The card's prompts from held-out text: the opening words of speeches spread evenly over the held-out works."""
from __future__ import annotations

import re
from collections.abc import Sequence

from ..spec.errors import InputError

# A speech: its speaker's heading alone on a line (capitals, ending in '.'), the speech's first line right after it
# (a stage direction in brackets or parentheses is not a speech; an act heading is followed by a blank line).
SPEECH = re.compile(r"^([A-Z][A-Z' -]*[A-Z])\.\n[ \t]*([^\s\[(].*)$", re.MULTILINE)


def speech_openings(text: str, words: int = 4) -> list[str]:
    """Every speech whose first line has more than `words` words, as "HEADING.\\n" + its first `words` words (so
    the prompt stops inside a line), in text order."""
    if words < 1:
        raise InputError(f"card prompts: words must be at least 1, got {words}")
    lines = [(m.group(1), m.group(2).split()) for m in SPEECH.finditer(text)]
    return [f"{who}.\n" + " ".join(line[:words]) for who, line in lines if len(line) > words]


def spread(items: Sequence, count: int, phase: float = 0.5) -> list:
    """`count` items evenly spaced over `items`: item floor((i + phase) · n / count) for i < count (phase in
    [0, 1); 0.5 takes the middle of each of count equal parts). All items when there are no more than count."""
    if not 0 <= phase < 1:
        raise InputError(f"card prompts: phase must lie in [0, 1), got {phase}")
    n = len(items)
    if n <= count:
        return list(items)
    return [items[int((i + phase) * n / count)] for i in range(count)]


def heldout_prompts(text: str, count: int = 8, words: int = 4, phase: float = 0.5) -> list[str]:
    """`count` speech openings spread over the held-out text (a fixed, deterministic choice)."""
    openings = speech_openings(text, words)
    if not openings:
        raise InputError("the held-out text has no speech to take the card's prompts from (a speaker's heading such "
                         "as 'BRUTUS.' alone on a line, the speech on the next)")
    return spread(openings, count, phase)
