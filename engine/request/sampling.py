"""The sampling options of a run (temperature, top-k, top-p, seed, history rules): their limits, checks and record."""
from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from ..spec.errors import InputError

# The smallest temperature sampled with: below it logits / T overflows float32 for ordinary logits (1e-45 makes every
# logit ±inf, and softmax NaN), and a distribution that sharp is greedy in all but exact ties. Use 0 for greedy.
MIN_TEMPERATURE = 1e-4
MAX_SEED = 2**63 - 1  # the largest seed: torch.Generator.manual_seed takes 64 bits, and seeds stay valid int64


def check_sampling(temperature: object, top_k: object, top_p: object,
                   names: tuple[str, str, str] = ("temperature", "top_k", "top_p")) -> None:
    """The sampling settings' one rule (the engine API and the CLI flags); names label the three in messages."""
    t_name, k_name, p_name = names
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
            or temperature < 0:
        raise InputError(f"{t_name} must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise InputError(f"{t_name} {temperature:g} is below {MIN_TEMPERATURE:g}, too small to sample with (logits / "
                         f"{temperature:g} overflow); use 0 for greedy decoding")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise InputError(f"{k_name} must be a non-negative integer (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:  # also refuses NaN
        raise InputError(f"{p_name} must lie in (0, 1] (1 = off), got {top_p!r}")


def check_repetition(repetition_penalty: object, no_repeat_ngram: object,
                     names: tuple[str, str] = ("repetition_penalty", "no_repeat_ngram")) -> None:
    """The rule of the two history-based settings (the engine API and the CLI flags); names label them in messages."""
    r_name, n_name = names
    if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, numbers.Real) \
            or not math.isfinite(repetition_penalty) or repetition_penalty <= 0:
        raise InputError(f"{r_name} must be a finite number > 0 (1 = off; above 1 discourages tokens already in the "
                         f"text), got {repetition_penalty!r}")
    if isinstance(no_repeat_ngram, bool) or not isinstance(no_repeat_ngram, int) or no_repeat_ngram < 0:
        raise InputError(f"{n_name} must be a non-negative integer (0 = off; n bans a token that would repeat an "
                         f"n-gram of the text), got {no_repeat_ngram!r}")


def checked_seed(seed: object, name: str = "seed") -> int | tuple[int, ...] | None:
    """The seed as an int in 0..MAX_SEED, a tuple of such ints (one per prompt), or None (random); InputError
    naming `name` otherwise. Row i samples with seed + i, which generation checks once it knows the rows."""
    if seed is None:
        return None
    if hasattr(seed, "tolist"):  # a numpy array or a tensor of seeds
        seed = seed.tolist()
    if isinstance(seed, (str, bytes)) or not isinstance(seed, (numbers.Integral, Sequence)):
        raise InputError(f"{name} must be an integer, a list of integers (one per prompt) or None, got {seed!r}")
    values = [seed] if isinstance(seed, numbers.Integral) else list(seed)
    out = []
    for row, value in enumerate(values):
        if isinstance(value, bool):
            raise InputError(f"{name} must be an integer, got {value!r}")
        try:
            number = operator.index(value)
        except TypeError:
            raise InputError(f"{name} must be an integer, got {value!r}") from None
        if not 0 <= number <= MAX_SEED:
            raise InputError(f"generate: the {name} of row {row} is {number}, outside 0..2**63-1 (row i samples with "
                             f"{name} + i)")
        out.append(number)
    return out[0] if isinstance(seed, numbers.Integral) else tuple(out)


@dataclass(frozen=True)
class SamplingParams:
    """How each next token is chosen; refused at construction with a message naming the bad field."""
    temperature: float = 0.0   # 0 = greedy (argmax); else at least MIN_TEMPERATURE
    top_k: int = 0             # 0 = no top-k cut
    top_p: float = 1.0         # 1 = no nucleus cut
    repetition_penalty: float = 1.0  # 1 = off; CTRL-style on every token already in the row's history
    no_repeat_ngram: int = 0         # 0 = off; n: a token that would complete an n-gram of the history is banned
    seed: int | tuple[int, ...] | None = None  # row i samples with seed + i (or seed[i]); None = random

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_repetition(self.repetition_penalty, self.no_repeat_ngram)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "repetition_penalty", float(self.repetition_penalty))
        object.__setattr__(self, "seed", checked_seed(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        """Whether the choice depends on the tokens before the position (then apply_history_rules first)."""
        return self.repetition_penalty != 1 or self.no_repeat_ngram > 0
