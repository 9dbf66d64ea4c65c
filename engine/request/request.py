"""GenerationRequest: everything one generation run is asked to do, checked once, in one typed object."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..spec.errors import InputError
from ..text.tokenizer import EOS_ID
from .interventions import Intervention, as_intervention
from .sampling import SamplingParams

if TYPE_CHECKING:  # torch-bound packages: named for annotations only, so this package loads without torch
    from ..dspark.config import DSparkConfig
    from ..trace import Trace

GREEDY = SamplingParams()
# Prompt tokens per prefill forward: a longer prompt runs in consecutive chunks through the same cache (the same
# result up to float rounding), so its activations stay those of one chunk; `engine plan`'s --prefill-chunk default.
PREFILL_CHUNK = 4096


def check_max_new_tokens(max_new_tokens: object) -> None:
    """InputError unless the token budget is a whole number >= 0."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InputError(f"generate: max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")


@dataclass(frozen=True)
class GenerationRequest:
    """One run's options: how many tokens, how each is chosen, when a row stops, and how the loop runs.

    sampling: temperature, top-k/top-p, seed and the history rules (SamplingParams). stop_tokens: a row ends at the
    first of them (not appended). dspark: a DSparkConfig to decode speculatively, None for plain decoding.
    interventions: what-if changes (engine.request.interventions, items or texts such as 'ban-expert:3:5@12'),
    checked against the model's config when the run starts, applied to every forward and recorded in the trace's
    meta. trace: a Trace the run records into, or None. cuda_graphs: decode steps through engine.graphs (CUDA graphs
    on a GPU, the same static body eagerly on a CPU); compiled: those bodies through torch.compile. prefill_chunk:
    prompt tokens per prefill forward (a longer prompt runs in consecutive chunks, bounding its activations)."""
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    stop_tokens: tuple[int, ...] = (EOS_ID,)
    dspark: DSparkConfig | None = None
    interventions: tuple[Intervention, ...] = ()
    trace: Trace | None = field(default=None, compare=False)
    cuda_graphs: bool = False
    compiled: bool = False
    prefill_chunk: int = PREFILL_CHUNK

    def __post_init__(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        if not isinstance(self.sampling, SamplingParams):
            raise InputError(f"generate: sampling must be a SamplingParams, got {type(self.sampling).__name__}")
        object.__setattr__(self, "stop_tokens", _stop_tokens(self.stop_tokens))
        if isinstance(self.interventions, (str, Intervention)):
            raise InputError("generate: interventions must be a list of interventions, got a single one "
                             f"({self.interventions!r}); wrap it in a list")
        items = () if self.interventions is None else self.interventions
        object.__setattr__(self, "interventions", tuple(as_intervention(i) for i in items))
        for name in ("cuda_graphs", "compiled"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"generate: {name} must be True or False, got {getattr(self, name)!r}")
        chunk = self.prefill_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InputError(f"generate: prefill_chunk must be a positive number of tokens, got {chunk!r}")

    @classmethod
    def of(cls, max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           seed: int | Sequence[int] | None = None, repetition_penalty: float = 1.0, no_repeat_ngram: int = 0,
           stop_tokens: Sequence[int] = (EOS_ID,), dspark: DSparkConfig | None = None,
           interventions: Sequence[Intervention | str] = (), trace: Trace | None = None, cuda_graphs: bool = False,
           compiled: bool = False, prefill_chunk: int = PREFILL_CHUNK) -> GenerationRequest:
        """A request from flat settings: the sampling ones become its SamplingParams."""
        sampling = SamplingParams(temperature, top_k, top_p, repetition_penalty, no_repeat_ngram, seed)
        return cls(max_new_tokens, sampling, tuple(stop_tokens), dspark, tuple(interventions), trace, cuda_graphs,
                   compiled, prefill_chunk)

    @classmethod
    def greedy(cls, max_new_tokens: int) -> GenerationRequest:
        """Greedy decoding of up to max_new_tokens per prompt, no trace, no DSpark."""
        return cls(max_new_tokens)

    @property
    def graphed(self) -> bool:
        """Whether the decode steps run through engine.graphs' static bodies (cuda_graphs or compiled)."""
        return self.cuda_graphs or self.compiled

    def with_sampling(self, **changes: object) -> GenerationRequest:
        """The same request with some sampling fields changed (dataclasses.replace on the SamplingParams)."""
        return replace(self, sampling=replace(self.sampling, **changes))


def _stop_tokens(tokens: object) -> tuple[int, ...]:
    """The stop tokens as a tuple of ints; InputError for anything that is not a collection of token ids."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, set, frozenset)):
        raise InputError(f"generate: stop_tokens must be a list of token ids, got {tokens!r}")
    out = []
    for t in tokens:
        try:
            out.append(operator.index(t))
        except TypeError:
            raise InputError(f"generate: stop_tokens must be token ids, got {t!r}") from None
    return tuple(out)
