"""Next-token choice: greedy at temperature 0, else softmax(logits / T) after top-k and top-p, seeded per row (the
options and their limits: engine.request.sampling)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..request.sampling import SamplingParams
from ..spec.errors import EngineError, InputError

# sample_index keeps one running sum over up to ONE_PASS_MAX weights; a larger vocabulary is searched by blocks of
# SAMPLE_BLOCK weights (their sums, then one block's running sum), since a float64 running sum over a 129,280-id
# vocabulary costs many times more than the blocks (scripts/bench_sampling.py)
ONE_PASS_MAX, SAMPLE_BLOCK = 16384, 256


class NonFiniteLogitsError(EngineError):
    """The model produced NaN or Inf logits (broken weights or config values); no token can be chosen from them."""


def apply_history_rules(logits: torch.Tensor, histories: Sequence[Sequence[int]],
                        params: SamplingParams) -> torch.Tensor:
    """Logits [R, V] after the rules that look at each row's history (its prompt and every token before the
    position being chosen; histories[r] for row r): first the repetition penalty, then the no-repeat n-gram ban.
    The same tensor when both are off. Applied before temperature, top-k and top-p, to greedy and sampled
    decoding alike.

    Repetition penalty ρ (Keskar et al. 2019, CTRL): the logit l of every token that occurs in the history becomes
    l / ρ when positive and l · ρ otherwise, so ρ > 1 lowers it either way. No-repeat n-gram size n: a token t
    gets −inf when history[-(n-1):] + [t] already occurs in the history. When the ban would leave a row no token
    at all (a tiny vocabulary), that row is left unbanned."""
    if not params.uses_history:
        return logits
    if len(histories) != logits.shape[0]:
        raise InputError(f"apply_history_rules: {logits.shape[0]} rows of logits but {len(histories)} histories")
    out = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    rho = params.repetition_penalty
    if rho != 1:
        seen = torch.zeros(out.shape, dtype=torch.bool, device=out.device)  # [R, V]
        for row, history in enumerate(histories):
            if len(history):
                seen[row, torch.as_tensor(list(history), dtype=torch.long, device=out.device)] = True
        out = torch.where(seen, torch.where(out > 0, out / rho, out * rho), out)
    if params.no_repeat_ngram:
        for row, history in enumerate(histories):
            banned = np.unique(repeated_ngram_ends(history, params.no_repeat_ngram))
            if 0 < banned.size < out.shape[-1]:
                out[row, torch.from_numpy(banned).to(out.device)] = float("-inf")
    return out


def repeated_ngram_ends(history: Sequence[int], n: int) -> np.ndarray:
    """The tokens t (with repeats) for which history[-(n-1):] + [t] is an n-gram already in the history."""
    h = np.asarray(history, dtype=np.int64)
    if n < 1 or h.size < n:
        return np.zeros(0, np.int64)
    if n == 1:
        return h
    grams = np.lib.stride_tricks.sliding_window_view(h, n)                 # [L − n + 1, n]
    hit = (grams[:, :-1] == h[h.size - n + 1:]).all(axis=1)                # their first n − 1 equal the last n − 1
    return grams[hit, -1]


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
    if not bool(torch.isfinite(probs.sum())) and not bool(torch.isfinite(probs).all()):  # as check_finite_logits
        row = int((~torch.isfinite(probs)).any(-1).nonzero()[0, 0])  # the drafter samples from unchecked logits
        raise NonFiniteLogitsError(f"generation stopped: the distribution row {row} is drawn from is not finite "
                                   "(its logits hold NaN or Inf); the checkpoint's weights or the config's float "
                                   "values are broken")
    return torch.cat([sample_index(probs[i], g) for i, g in enumerate(generators)])


def sample_index(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index [1] (int64, on weights' device) drawn with probability proportional to the finite, non-negative
    weights [V] (normalised or not), as torch.multinomial(weights, 1) draws it, from one uniform number u of
    `generator`: the first index whose running sum (float64) exceeds u times the total, so that an index of weight 0
    is never drawn. torch.multinomial draws one exponential variate per weight, several times slower on the CPU
    (scripts/bench_sampling.py); this sums the weights once and, past ONE_PASS_MAX of them, keeps the running sum of
    the block sums and of the one block u falls in."""
    w = weights.reshape(-1)
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=w.device)
    if w.numel() <= ONE_PASS_MAX:
        running = w.double().cumsum(0)                                        # [V]
        return torch.tensor([_first_above(running, u * _total(running))], device=w.device)
    full = w.numel() - w.numel() % SAMPLE_BLOCK
    sums = w[:full].view(-1, SAMPLE_BLOCK).sum(-1, dtype=torch.float64)       # [V // SAMPLE_BLOCK]
    if full < w.numel():
        sums = torch.cat([sums, w[full:].sum(0, dtype=torch.float64, keepdim=True)])
    running = sums.cumsum(0)                                                  # [blocks]
    target = u * _total(running)
    b = _first_above(running, target)
    inside = target - running[b - 1] if b else target                         # where u falls inside block b
    start = b * SAMPLE_BLOCK
    return torch.tensor([start + _first_above(w[start:start + SAMPLE_BLOCK].double().cumsum(0), inside)],
                        device=w.device)


def _total(running: torch.Tensor) -> torch.Tensor:
    """The last running sum [1], refused unless positive."""
    total = running[-1:]
    if not bool(total > 0):
        raise InputError(f"cannot draw from weights that sum to {float(total)} (they must be finite, non-negative "
                         "and not all 0)")
    return total


def _first_above(running: torch.Tensor, target: torch.Tensor) -> int:
    """The first position whose running sum [n] exceeds target [1] (0 <= target < the last sum): a position of
    weight 0 leaves the sum as it was, so it is never the first. Rounding may put target at the last sum: then the
    last position of positive weight."""
    i = int(torch.searchsorted(running, target, right=True))
    if i == running.numel():
        i = int((torch.diff(running, prepend=running.new_zeros(1)) > 0).nonzero()[-1])
    return i


def check_finite_logits(logits: torch.Tensor, where: Callable[[int], str]) -> None:
    """NonFiniteLogitsError unless logits [R, ...] are all finite; where(r) names the first bad row r's place.

    The check every decoding step pays: one sum and one host read. A NaN or ±Inf anywhere makes the sum non-finite
    (a vectorised reduction, an order of magnitude cheaper on the CPU than isfinite(logits).all() over a
    129,280-wide row); only then is each value looked at, which also clears a sum that merely overflowed."""
    if bool(torch.isfinite(logits.sum())):
        return
    finite = torch.isfinite(logits)
    if bool(finite.all()):
        return
    row = int((~finite).reshape(finite.shape[0], -1).any(-1).nonzero()[0, 0])
    raise NonFiniteLogitsError(f"generation stopped: the model's logits {where(row)} are not finite (NaN or Inf), so "
                               "no token can be chosen; the checkpoint's weights or the config's float values are "
                               "broken (check them, e.g. load the checkpoint again or validate the config)")
