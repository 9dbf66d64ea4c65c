"""What both decoding loops share: result types, request checks, row seeds, timing and the per-token emit."""
from __future__ import annotations

import numbers
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self

import torch

from ..model.interventions import Interventions
from ..model.transformer import Transformer
from ..request.interventions import Intervention
from ..request.sampling import MAX_SEED
from ..spec.errors import InputError
from ..text.tokenizer import EOS_ID
from ..trace import Trace

__all__ = ["EOS_ID", "Emitter", "GenerationResult", "OnToken", "StepInfo", "check_prompts", "elapsed", "row_seeds",
           "run_interventions"]


@dataclass(frozen=True)
class StepInfo:
    """What the on_token callback learns with each token."""
    step: int            # 0 = the token chosen from the prefill logits
    pos: int             # the position the token occupies
    time_s: float        # wall time of the forward that produced it
    prob: float          # its probability under the distribution it was drawn from


@dataclass
class GenerationResult:
    tokens: list[list[int]]                 # new tokens per prompt (stop tokens not included)
    finish_reasons: list[str]               # "stop" | "length" | "max_seq_len" per prompt
    prompt_lengths: list[int]
    prefill_s: float = 0.0                  # all prompts' prefill forwards
    decode_s: float = 0.0                   # all decode steps: each token's choice and the forward after it
    step_times: list[float] = field(default_factory=list)  # one per decode step

    @classmethod
    def for_prompts(cls, prompts: Sequence[Sequence[int]]) -> Self:
        """An empty result, one row per prompt."""
        return cls([[] for _ in prompts], [""] * len(prompts), [len(p) for p in prompts])

    @property
    def n_new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def prefill_tokens_per_s(self) -> float:
        return sum(self.prompt_lengths) / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens after the first of each row (those came from prefill) per second of decode."""
        decoded = sum(max(len(t) - 1, 0) for t in self.tokens)
        return decoded / self.decode_s if self.decode_s > 0 else float("nan")


OnToken = Callable[[int, int, StepInfo], None]


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int) -> list[list[int]]:
    """The prompts as lists of ints, refused with a message naming the prompt when one cannot be run."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise InputError("generate: prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        ids = _token_ids(p, i, max_seq_len)
        if not ids:
            raise InputError(f"generate: prompt {i} is empty; give at least one token (e.g. BOS = 0)")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"generate: prompt {i} has token id(s) {bad[:5]} outside 0..{vocab_size - 1}")
        out.append(ids)
    return out


def _token_ids(prompt, index: int, max_seq_len: int) -> list[int]:
    """One prompt's ids as ints; a str, a non-sequence, one longer than max_seq_len (refused before its ids are
    read) or a non-integer id is refused, naming where."""
    values = prompt.tolist() if hasattr(prompt, "tolist") else prompt  # a tensor or a numpy array
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InputError(f"generate: prompt {index} must be a list of token ids, got {type(prompt).__name__}")
    if len(values) > max_seq_len:
        raise InputError(f"generate: prompt {index} has {len(values)} tokens, more than the model's "
                         f"max_seq_len of {max_seq_len}")
    ids = []
    for pos, t in enumerate(values):
        try:
            ids.append(operator.index(t))
        except TypeError:
            raise InputError(f"generate: prompt {index} has {t!r} at position {pos}, not an integer token id") from None
    return ids


def row_seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    """One sampling seed per row: seed + i for an int, the given list as is, random without a seed."""
    if seed is None:
        return [int(torch.randint(0, 2**62, ())) for _ in range(n)]
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        seeds = [int(seed) + i for i in range(n)]
    else:
        seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise InputError(f"generate: {len(seeds)} seeds for {n} prompts")
    for row, s in enumerate(seeds):
        if not 0 <= s <= MAX_SEED:
            raise InputError(f"generate: the seed of row {row} is {s}, outside 0..2**63-1 (row i samples with "
                             "seed + i)")
    return seeds


def elapsed(t0: float, device: torch.device) -> float:
    """Seconds since t0 (time.perf_counter), after the device's queued work has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def run_interventions(model: Transformer, items: Interventions | Iterable[Intervention | str],
                      trace: Trace | None = None, *, graphed: bool = False) -> Interventions:
    """One run's interventions, checked against the model's config and written into the trace's meta ("interventions":
    their canonical texts, [] for none). Refused where the run would not apply them: CUDA-graphed or compiled decode
    steps (captured without them) and a model split over ranks (torchrun)."""
    checked = Interventions.of(items, model.args)
    if checked and graphed:
        raise InputError("interventions run on the eager decode path: CUDA-graphed and torch.compile'd steps are "
                         "captured without them; leave out cuda_graphs / --cuda-graphs and --compile")
    world = getattr(model, "world", None)
    if checked and world is not None:
        raise InputError(f"interventions are not supported on a model split over {world.size} ranks (torchrun); "
                         "run in one process")
    if trace is not None:
        trace.meta["interventions"] = checked.texts
    return checked


class Emitter:
    """Commits tokens to a result the same way for every loop: stop check, append, trace, callback, finish."""

    def __init__(self, result: GenerationResult, max_new_tokens: int, max_seq_len: int, stop_tokens: Sequence[int],
                 trace: Trace | None, token_text: Callable[[int], str] | None, on_token: OnToken | None) -> None:
        self.result, self.max_new_tokens, self.max_seq_len = result, max_new_tokens, max_seq_len
        self.stop = {int(t) for t in stop_tokens}
        self.trace, self.on_token = trace, on_token
        self.text_of = token_text or (lambda t: "")

    def record_prompt(self, row: int, ids: list[int]) -> None:
        """The prompt's tokens into the trace, before its prefill: the prefill's forwards (prompt_logits=True) then
        score each of them with the logits of the position before it."""
        if self.trace is not None:
            self.trace.record_prompt(row, ids, [self.text_of(t) for t in ids])

    def emit(self, row: int, pos: int, token: int, step: int, time_s: float, logits: torch.Tensor,
             prob: float) -> bool:
        """Append one token at `pos`; False when the row is finished (a stop token is not appended)."""
        res = self.result
        if token in self.stop:
            res.finish_reasons[row] = "stop"
            return False
        res.tokens[row].append(token)
        if self.trace is not None:
            self.trace.record_token(row, pos, token, self.text_of(token), step=step, step_time_s=time_s,
                                    logits=logits)
        if self.on_token is not None:
            self.on_token(row, token, StepInfo(step, pos, time_s, prob))
        if len(res.tokens[row]) >= self.max_new_tokens:
            res.finish_reasons[row] = "length"
        elif pos + 1 >= self.max_seq_len:
            res.finish_reasons[row] = "max_seq_len"
        else:
            return True
        return False
