"""How many distinct routed experts a batch of B tokens reads: closed form and a seeded simulation (numpy)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.errors import InputError


def _check(n_experts: int, top_k: int, batch: int) -> None:
    if n_experts <= 0 or not 0 < top_k <= n_experts:
        raise InputError(f"need 0 < top_k <= n_experts, got top_k={top_k}, n_experts={n_experts}")
    if batch < 0:
        raise InputError(f"batch size must be non-negative, got {batch}")


def expected_touched(n_experts: int, top_k: int, batch: int) -> float:
    """E·(1 − (1 − k/E)^B): a token misses a given expert with probability 1 − k/E (uniform k-subset),
    tokens are independent, and linearity of expectation sums the per-expert hit probabilities."""
    _check(n_experts, top_k, batch)
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


@dataclass(frozen=True)
class Simulation:
    batch: int
    mean: float
    std_error: float   # standard error of the mean over the simulated batches
    trials: int


def simulate_touched(n_experts: int, top_k: int, batch: int, trials: int = 200, seed: int = 0) -> Simulation:
    """Draw k distinct experts per token for B tokens, count distinct experts, average over batches."""
    _check(n_experts, top_k, batch)
    if trials < 2:
        raise InputError(f"need at least 2 trials for a standard error, got {trials}")
    rng = np.random.default_rng(seed)
    counts = np.empty(trials)
    for i in range(trials):
        if batch == 0:
            counts[i] = 0
            continue
        # k distinct of E per token: the k smallest of E uniform keys form a uniform k-subset
        picks = np.argpartition(rng.random((batch, n_experts)), top_k - 1, axis=1)[:, :top_k]  # [B, k]
        counts[i] = np.unique(picks).size
    return Simulation(batch, float(counts.mean()), float(counts.std(ddof=1) / np.sqrt(trials)), trials)


def touched_table(n_experts: int, top_k: int, batches=(1, 8, 64, 256, 1024)) -> list[dict]:
    """Closed-form rows for display: batch, experts touched, fraction of the layer's experts read."""
    return [{"batch": b, "experts": expected_touched(n_experts, top_k, b),
             "fraction": expected_touched(n_experts, top_k, b) / n_experts} for b in batches]
