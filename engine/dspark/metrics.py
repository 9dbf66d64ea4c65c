"""DSpark aggregates over recorded steps: acceptance, accepted length, per-position acceptance, calibration."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..trace import DSparkStep


@dataclass
class DSparkMetrics:
    steps: int
    drafted: int                     # draft tokens produced (γ per step)
    scheduled: int                   # drafts sent to verification
    accepted: int                    # drafts the verifier kept
    bonus: int                       # steps whose every scheduled draft was accepted
    target_forwards: int
    mean_accepted_length: float      # tokens committed per step: accepted drafts + the replacement/bonus
    acceptance_rate: float           # accepted / scheduled
    tokens_per_forward: float        # committed tokens per target forward
    conditional_acceptance: list[float]  # [γ] P(draft k accepted | drafts < k accepted, k scheduled)
    predicted_survival: list[float]  # [γ] mean a_k over steps that scheduled draft k
    observed_survival: list[float]   # [γ] fraction of those steps that accepted drafts 1..k
    calibration_n: list[int]         # [γ] steps behind each calibration point
    mean_step_s: float

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        def fmt(xs):
            return " ".join("  -  " if np.isnan(x) else f"{x:.2f}" for x in xs)
        return [f"DSpark: {self.steps} steps, {self.target_forwards} target forwards; drafted {self.drafted}, "
                f"scheduled {self.scheduled}, accepted {self.accepted}, bonus {self.bonus}",
                f"  mean accepted length {self.mean_accepted_length:.3f} (bonus included), acceptance rate "
                f"{self.acceptance_rate:.3f}, {self.tokens_per_forward:.3f} tokens per target forward, "
                f"{self.mean_step_s * 1e3:.1f} ms per step",
                f"  conditional acceptance by position: {fmt(self.conditional_acceptance)}",
                f"  survival predicted: {fmt(self.predicted_survival)}",
                f"  survival observed:  {fmt(self.observed_survival)}"]


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summarize(steps: Sequence[DSparkStep], target_forwards: int | None = None,
              decode_s: float | None = None) -> DSparkMetrics:
    """Aggregate DSparkStep records (a run's, or Trace.dspark_steps)."""
    steps = list(steps)
    gamma = max((len(s.drafted) for s in steps), default=0)
    # a batched step verifies every row in one forward: without a count, one forward per step number
    forwards = len({s.step for s in steps}) if target_forwards is None else target_forwards
    reached, kept = np.zeros(gamma), np.zeros(gamma)          # draft k verified with all earlier accepted
    pred, obs, n_sched = np.zeros(gamma), np.zeros(gamma), np.zeros(gamma, dtype=np.int64)
    for s in steps:
        for k in range(s.verify_len):
            n_sched[k] += 1
            pred[k] += float(s.survival[k])
            obs[k] += s.accepted > k
            if s.accepted >= k:
                reached[k] += 1
                kept[k] += s.accepted > k
    committed = sum(s.accepted + 1 for s in steps)
    scheduled = sum(s.verify_len for s in steps)
    accepted = sum(s.accepted for s in steps)
    step_times = {s.step: s.time_s for s in steps}  # rows of one batched step share its time
    mean_step = _ratio(decode_s, forwards) if decode_s is not None else _ratio(sum(step_times.values()),
                                                                               len(step_times))
    return DSparkMetrics(
        steps=len(steps), drafted=sum(len(s.drafted) for s in steps), scheduled=scheduled, accepted=accepted,
        bonus=sum(s.next_kind == "bonus" for s in steps), target_forwards=forwards,
        mean_accepted_length=_ratio(committed, len(steps)), acceptance_rate=_ratio(accepted, scheduled),
        tokens_per_forward=_ratio(committed, forwards),
        conditional_acceptance=[_ratio(kept[k], reached[k]) for k in range(gamma)],
        predicted_survival=[_ratio(pred[k], n_sched[k]) for k in range(gamma)],
        observed_survival=[_ratio(obs[k], n_sched[k]) for k in range(gamma)],
        calibration_n=[int(x) for x in n_sched], mean_step_s=mean_step)
