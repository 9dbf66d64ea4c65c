"""PlainFallback: the auto schedule's plain steps while drafting does not pay, judged per drafting step."""
from __future__ import annotations

import torch

from .schedule import ThroughputTable, step_gain, step_rate


class PlainFallback:
    """The auto schedule's choice not to draft (one per generation run, for its whole batch). Each drafting step
    is judged by its gain over plain decoding (step_gain: tokens per second, the draft's cost counted, over one
    token per row per forward of one token, both costed from the profiled table): half the gain its calibrated
    confidences expected, half the gain its verdicts delivered (the confidences say what the drafter believes
    about this text, the verdicts correct them at once). The gains join a running mean (weight GAIN_WEIGHT for
    the newest). Once WARMUP drafting steps have shown how the drafter fares on this text, a mean below 1 makes the
    next `wait` steps plain — no draft, the anchor alone verified — and then the run drafts again to look: the
    drafter's confidence is only known by drafting. The wait starts at one step and doubles after each look that
    leaves the mean below 1, up to MAX_WAIT, so that a stretch of text the drafter cannot predict costs at most one
    draft in MAX_WAIT + 1 steps; a mean back above 1 resumes drafting at once. An eager drafting step then verifies
    at least one draft (schedule_throughput's `least`): the draft is paid for, and its verdict is what the judgement
    and the calibration learn from. A graphed one (fixed-width blocks) verifies all drafts or none (schedule_block):
    there a block costs as much for one draft as for γ, and a look whose confidences do not promise the block's
    cost takes a plain forward instead.

    The table is a prior, profiled once: the run's own step times correct it. Measured over the table's seconds,
    per kind of step (running means, weight TIME_WEIGHT), the two slowdowns scale the gain by plain's over
    drafting's once both kinds have run, so a table profiled under other load (which stretches the two unequally:
    a drafting step reads more weights) does not keep a run plain, or drafting, against its own evidence. The time
    a drafting step spends catching the rings up on plain steps' taps is plain steps' work, left out of its time.
    (WARMUP, GAIN_WEIGHT and MAX_WAIT were tuned on the shipped model, where a drafting step costs about 2.4 plain
    steps: other values moved the mean gain and the worst prompt by a few percent at most.)"""
    WARMUP, GAIN_WEIGHT, MAX_WAIT, TIME_WEIGHT = 4, 0.5, 8, 0.3

    def __init__(self, sps: ThroughputTable):
        self.sps, self.wait, self.backoff, self.looks, self.gain = sps, 0, 1, 0, 1.0
        self.slowdown: dict[str, float | None] = {"draft": None, "plain": None}   # measured s / table s

    def drafts(self) -> bool:
        """Whether this step drafts (False: a plain step, and one step less to wait)."""
        if self.wait:
            self.wait -= 1
            return False
        return True

    def correction(self) -> float:
        """Plain steps' slowdown over drafting steps' (1 until both kinds have run)."""
        d, p = self.slowdown["draft"], self.slowdown["plain"]
        return 1.0 if d is None or p is None else p / d

    def plain_step(self, rows: int, seconds: float) -> None:
        """A plain step of `rows` rows took `seconds`."""
        self._observe("plain", seconds, 1.0 / self.sps(rows))

    def judge(self, confidence: torch.Tensor, lengths: list[int], accepted: list[int],
              seconds: float | None = None) -> None:
        """After a drafting step that verified `lengths` (scheduled from `confidence` [R, γ]) and kept `accepted`
        drafts per row, taking `seconds` (None: not measured): keep drafting, or wait."""
        n_req, verified = len(lengths), sum(lengths)
        draft_s = self.sps.draft_cost(n_req)
        if seconds is not None:
            self._observe("draft", seconds, draft_s + 1.0 / self.sps(n_req + verified))
        delivered = step_rate(n_req + sum(accepted), n_req + verified, self.sps, draft_s) / (n_req * self.sps(n_req))
        gain = 0.5 * (step_gain(confidence, lengths, self.sps) + delivered) * self.correction()
        self.looks += 1
        self.gain += self.GAIN_WEIGHT * (gain - self.gain)
        if self.gain >= 1.0 or self.looks < self.WARMUP:
            self.backoff = 1
        else:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, self.MAX_WAIT)

    def _observe(self, kind: str, seconds: float, predicted: float) -> None:
        old, ratio = self.slowdown[kind], seconds / predicted
        self.slowdown[kind] = ratio if old is None else old + self.TIME_WEIGHT * (ratio - old)
