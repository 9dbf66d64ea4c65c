"""Next-token choice: greedy at temperature 0, else softmax(logits / T) after top-k and top-p, seeded per row."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy (argmax)
    top_k: int = 0             # 0 = no top-k cut
    top_p: float = 1.0         # 1 = no nucleus cut

    def __post_init__(self) -> None:
        if not (self.temperature >= 0):  # also refuses NaN
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InputError(f"top_k must be a non-negative integer (0 = off), got {self.top_k!r}")
        if not (0 < self.top_p <= 1):
            raise InputError(f"top_p must lie in (0, 1] (1 = off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits [B, V] with the tokens outside top-k / the top-p nucleus set to -inf (order: k, then p).

    top-k keeps every token whose logit is at least the k-th largest (ties at the boundary all stay).
    top-p keeps the most probable tokens until their probability sum first reaches p: a token stays when
    the mass strictly before it (in descending order) is below p, so the most probable token always stays.
    """
    out = logits.float().clone()
    if top_k and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # [B, 1]
        out.masked_fill_(out < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(out, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out.masked_fill_(drop, float("-inf"))
    return out


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution [B, V] a token is drawn from: one-hot argmax when greedy."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits / params.temperature, params.top_k, params.top_p), dim=-1)


def make_generators(seeds: list[int | None], device: torch.device | str) -> list[torch.Generator | None]:
    """One generator per row so that a row's draws do not depend on the other rows in the batch."""
    gens: list[torch.Generator | None] = []
    for s in seeds:
        if s is None:
            gens.append(None)
        else:
            g = torch.Generator(device=device)
            g.manual_seed(int(s))
            gens.append(g)
    return gens


def sample(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token id per row [B] (int64) from logits [B, V]."""
    if logits.dim() != 2:
        raise InputError(f"sample: logits must be [B, V], got shape {tuple(logits.shape)}")
    if params.greedy:
        return logits.argmax(-1)
    if len(generators) != logits.shape[0]:
        raise InputError(f"sample: {logits.shape[0]} rows but {len(generators)} generators")
    return draw(probabilities(logits, params), generators)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One index per row [B] from probabilities [B, V], row i drawn with generators[i]."""
    return torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])
