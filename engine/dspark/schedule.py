"""Which draft prefix each request verifies: all, a confidence threshold, or the DSpark Alg. 1 scheduler."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from ..spec.errors import InputError


def survival(confidence: torch.Tensor) -> torch.Tensor:
    """Prefix survival a_j = prod_{i<=j} c_i along the last axis; non-increasing since 0 <= c <= 1.  [R, γ]"""
    return torch.cumprod(confidence.clamp(0.0, 1.0), dim=-1)


def schedule_all(confidence: torch.Tensor) -> list[int]:
    """Verify every drafted token."""
    return [confidence.shape[-1]] * confidence.shape[0]


def schedule_threshold(confidence: torch.Tensor, threshold: float) -> list[int]:
    """Cut each proposal before the first draft whose own confidence falls below `threshold` (spec §8.2)."""
    below = confidence < threshold                                  # [R, γ]
    first = torch.where(below.any(-1), below.float().argmax(-1), torch.full_like(below[:, 0], below.shape[-1],
                                                                                 dtype=torch.long))
    return [int(x) for x in first]


@dataclass
class ThroughputTable:
    """Target forward steps per second as a function of the tokens verified in one batch (profiled once)."""
    batch_tokens: list[int]
    steps_per_second: list[float]
    device: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.batch_tokens or len(self.batch_tokens) != len(self.steps_per_second):
            raise InputError("ThroughputTable needs matching, non-empty batch_tokens and steps_per_second")
        if sorted(self.batch_tokens) != list(self.batch_tokens) or min(self.batch_tokens) < 1:
            raise InputError(f"ThroughputTable batch_tokens must be increasing and >= 1: {self.batch_tokens}")

    def __call__(self, tokens: int) -> float:
        """Linear interpolation between profiled points; constant beyond the ends."""
        xs, ys = self.batch_tokens, self.steps_per_second
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1]
        k = bisect.bisect_left(xs, tokens)
        x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


def schedule_throughput(confidence: torch.Tensor, sps: ThroughputTable, early_stop: bool = True) -> list[int]:
    """DSpark Alg. 1: grow the verified prefixes in order of survival while expected tokens/s improves.

    Each request always verifies its anchor (one token of batch work, one expected token). Adding draft j of
    request r costs one more batch token and is expected to yield a[r][j] more accepted tokens. Visiting the
    (r, j) pairs by decreasing a keeps every request's choice a prefix, since a is non-increasing along j.
    With early_stop the search ends at the first pair that does not improve throughput (the paper's online
    form); without it, every total is tried and the best kept, which is the exact optimum.
    """
    a = survival(confidence)                                        # [R, γ]
    n_req, gamma = a.shape
    pairs = sorted(((float(a[r, j]), r, j) for r in range(n_req) for j in range(gamma) if a[r, j] > 0),
                   key=lambda t: (-t[0], t[2], t[1]))
    lengths = [0] * n_req
    batch, expected = n_req, float(n_req)
    best_rate, best = expected * sps(batch), list(lengths)
    for value, r, j in pairs:
        lengths[r] = j + 1
        batch += 1
        expected += value
        rate = expected * sps(batch)
        if rate > best_rate:
            best_rate, best = rate, list(lengths)
        elif early_stop:
            break
    return best
