"""Token windows cut from a corpus stream: random training batches and the fixed held-out windows."""
from __future__ import annotations

import numpy as np
import torch

from ..spec.errors import InputError


def train_windows(tokens: np.ndarray, step: int, cfg) -> torch.Tensor:
    """[cfg.batch, cfg.seq + 1] random windows of the training stream, a pure function of (cfg.seed, step):
    resume needs no RNG state and replays exactly the batches an uninterrupted run would see."""
    if tokens.size < cfg.seq + 2:
        raise InputError(f"the training stream has {tokens.size} tokens; --seq {cfg.seq} needs at least {cfg.seq + 2}")
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, tokens.size - cfg.seq - 1, cfg.batch)
    return torch.from_numpy(np.stack([tokens[s:s + cfg.seq + 1] for s in starts]).astype(np.int64))


def heldout_windows(tokens: np.ndarray, seq: int, count: int) -> np.ndarray:
    """[min(count, fit), seq + 1] int64 non-overlapping windows spread evenly over the stream (a fixed set:
    training evaluates on it and the model card measures on it)."""
    n_all = (tokens.size - 1) // (seq + 1)
    if n_all < 1:
        raise InputError(f"the stream has {tokens.size} tokens; --seq {seq} needs at least {seq + 2}")
    picks = np.linspace(0, n_all - 1, min(count, n_all)).round().astype(np.int64)
    return np.stack([tokens[i * (seq + 1):(i + 1) * (seq + 1)] for i in picks]).astype(np.int64)
