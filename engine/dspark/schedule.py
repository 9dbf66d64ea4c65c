"""Which draft prefix each request verifies: all, a confidence threshold, or the DSpark Alg. 1 scheduler (and
the expected gain of a drafting step over plain decoding that it maximises)."""
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


def schedule_block(confidence: torch.Tensor, block_over_plain: float) -> list[int]:
    """A verify block of fixed width (CUDA graphs, torch.compile) costs the same whatever ℓ, so a step that drafted
    verifies either every draft of every row or none (the anchors alone, through a plain forward): every draft when
    the block's expected tokens (each row's anchor plus the survival of its drafts) per its time beat a plain
    forward's one token per row. block_over_plain: the block forward's seconds over a plain forward's."""
    n_req = confidence.shape[0]
    expected = n_req + float(survival(confidence).sum())
    return schedule_all(confidence) if expected >= n_req * block_over_plain else [0] * n_req


def schedule_threshold(confidence: torch.Tensor, threshold: float) -> list[int]:
    """Cut each proposal before the first draft whose own confidence falls below `threshold` (spec §8.2)."""
    below = confidence < threshold                                  # [R, γ]
    first = torch.where(below.any(-1), below.float().argmax(-1), torch.full_like(below[:, 0], below.shape[-1],
                                                                                 dtype=torch.long))
    return [int(x) for x in first]


def interpolate(xs: list[int], ys: list[float], x: float) -> float:
    """Linear interpolation between the points (xs increasing); constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    k = bisect.bisect_left(xs, x)
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class ThroughputTable:
    """Target forward steps per second as a function of the tokens verified in one batch, and the seconds one
    draft of a batch of rows costs (the drafter's forward and heads, and its rings taking the verified block's
    features): profiled once per machine, model and code (engine.dspark.profile). Without draft costs (a table
    made by hand) the scheduler counts drafting as free, and the auto schedule neither calibrates confidences nor
    falls back to plain steps (engine.dspark.calibration, engine.dspark.fallback)."""
    batch_tokens: list[int]
    steps_per_second: list[float]
    device: str = ""
    meta: dict = field(default_factory=dict)
    draft_rows: list[int] = field(default_factory=list)         # batch rows the drafter was timed at
    draft_seconds: list[float] = field(default_factory=list)    # one draft step of that many rows

    def __post_init__(self) -> None:
        if not self.batch_tokens or len(self.batch_tokens) != len(self.steps_per_second):
            raise InputError("ThroughputTable needs matching, non-empty batch_tokens and steps_per_second")
        if sorted(self.batch_tokens) != list(self.batch_tokens) or min(self.batch_tokens) < 1:
            raise InputError(f"ThroughputTable batch_tokens must be increasing and >= 1: {self.batch_tokens}")
        if len(self.draft_rows) != len(self.draft_seconds) or sorted(self.draft_rows) != list(self.draft_rows):
            raise InputError("ThroughputTable needs increasing draft_rows with one draft_seconds value each")

    def __call__(self, tokens: int) -> float:
        """Steps per second at `tokens` batch tokens: linear interpolation, constant beyond the ends."""
        return interpolate(self.batch_tokens, self.steps_per_second, tokens)

    def draft_cost(self, rows: int) -> float:
        """Seconds one draft step of `rows` rows adds to its verify forward (0 when the table has none)."""
        return interpolate(self.draft_rows, self.draft_seconds, rows) if self.draft_rows else 0.0


def step_rate(expected: float, batch_tokens: int, sps: ThroughputTable, draft_s: float) -> float:
    """Expected tokens per second of a step: expected tokens over the draft's seconds plus the verify forward's."""
    return expected * sps(batch_tokens) if not draft_s else expected / (draft_s + 1.0 / sps(batch_tokens))


def schedule_throughput(confidence: torch.Tensor, sps: ThroughputTable, early_stop: bool = True,
                        least: int = 0) -> list[int]:
    """DSpark Alg. 1: grow the verified prefixes in order of survival while expected tokens/s improves.

    Each request always verifies its anchor (one token of batch work, one expected token). Adding draft j of
    request r costs one more batch token and is expected to yield a[r][j] more accepted tokens. Visiting the
    (r, j) pairs by decreasing a keeps every request's choice a prefix, since a is non-increasing along j.
    With early_stop the search ends at the first pair that does not improve throughput (the paper's online
    form); without it, every total is tried and the best kept, which is the exact optimum. A step's time is
    its verify forward plus the draft's cost from the table (sps.draft_cost), so that the rate is the one a
    drafting step achieves (drafting_pays compares it with plain decoding's). `least`: drafts every request
    verifies whatever their survival (the search starts from there), so that a step whose verify block costs a
    jump at its second token is not stopped by that jump before the flatter part of the curve.
    """
    a = survival(confidence)                                        # [R, γ]
    n_req, gamma = a.shape
    least = min(least, gamma)
    draft_s = sps.draft_cost(n_req)
    pairs = sorted(((float(a[r, j]), r, j) for r in range(n_req) for j in range(least, gamma) if a[r, j] > 0),
                   key=lambda t: (-t[0], t[2], t[1]))
    lengths = [least] * n_req
    batch, expected = n_req * (1 + least), n_req + float(a[:, :least].sum())
    best_rate, best = step_rate(expected, batch, sps, draft_s), list(lengths)
    for value, r, j in pairs:
        lengths[r] = j + 1
        batch += 1
        expected += value
        rate = step_rate(expected, batch, sps, draft_s)
        if rate > best_rate:
            best_rate, best = rate, list(lengths)
        elif early_stop:
            break
    return best


def step_gain(confidence: torch.Tensor, lengths: list[int], sps: ThroughputTable) -> float:
    """A step that drafted and verifies `lengths`: its expected tokens (each row's anchor plus the survival of its
    verified drafts) per second, the draft's cost counted, over plain decoding's one token per row per forward of
    one token (costed from the same table). Above 1: drafting pays."""
    n_req = len(lengths)
    a = survival(confidence)                                        # [R, γ]
    expected = n_req + sum(float(a[r, :ell].sum()) for r, ell in enumerate(lengths))
    return step_rate(expected, n_req + sum(lengths), sps, sps.draft_cost(n_req)) / (n_req * sps(n_req))


def drafting_pays(confidence: torch.Tensor, lengths: list[int], sps: ThroughputTable) -> bool:
    """Whether such a step is expected to beat plain decoding (step_gain ≥ 1)."""
    return step_gain(confidence, lengths, sps) >= 1.0
