"""OnlineCalibration: the drafter's confidences scaled towards the acceptance a run observes, per draft position."""
from __future__ import annotations

import torch


class OnlineCalibration:
    """The auto schedule's correction of the drafter's confidences from the run's own verdicts. c_k estimates
    P(draft k accepted | drafts < k accepted); over the steps that verified draft k with the earlier ones
    accepted, the observed acceptances and the predicted c_k are summed per position, and c_k is scaled by their
    ratio (then clipped to 1), each position's ratio shrunk towards the ratio pooled over all positions and that
    one towards 1 by PRIOR pseudo-steps, so that a position seldom verified borrows from the others and the first
    steps use the drafter as it is. Only past verdicts enter, so the schedule stays lossless. (A drafter trained
    on its target's greedy text is underconfident on other text: its c_k ≈ 0.5 where 0.7-0.8 are accepted.)"""
    PRIOR = 4.0

    def __init__(self, gamma: int):
        self.predicted, self.observed = [0.0] * gamma, [0.0] * gamma

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Calibrated confidences [R, γ] (the same when nothing was verified yet)."""
        pooled = (sum(self.observed) + self.PRIOR) / (sum(self.predicted) + self.PRIOR)
        ratio = [(o + self.PRIOR * pooled) / (p + self.PRIOR) for p, o in zip(self.predicted, self.observed)]
        return (confidence * torch.tensor(ratio, dtype=confidence.dtype)).clamp(max=1.0)

    def update(self, confidence: torch.Tensor, lengths: list[int], accepted: list[int]) -> None:
        """Add one step's raw confidences [R, γ], verified lengths and accepted counts per row."""
        for c, ell, acc in zip(confidence.tolist(), lengths, accepted):
            for k in range(min(ell, acc + 1)):          # draft k was verified with drafts < k accepted
                self.predicted[k] += c[k]
                self.observed[k] += acc > k
