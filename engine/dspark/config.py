"""DSparkConfig: which schedule picks the verified prefix, and how confidences are calibrated."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..request.schedules import SCHEDULES
from ..spec.errors import InputError
from .calibration import OnlineCalibration
from .fallback import PlainFallback
from .profile import profile_and_store, stored_table, table_path
from .schedule import ThroughputTable, schedule_all, schedule_block, schedule_threshold, schedule_throughput


@dataclass(frozen=True)
class DSparkConfig:
    schedule: str = "all"              # all | threshold | auto (DSpark Alg. 1 with a profiled table)
    threshold: float = 0.5             # for "threshold": cut before the first draft with c_k below it
    sps: ThroughputTable | None = None  # for "auto": steps per second by batch tokens
    early_stop: bool = True            # for "auto": the paper's online form; False = global search
    plain_fallback: bool = True        # for "auto": decode plainly while drafting does not pay (PlainFallback)
    calibrate: bool = True             # for "auto": scale confidences by the run's verdicts (OnlineCalibration)
    # Sequential Temperature Scaling: c_k = sigmoid(z_k / t_k), one t per draft position, fitted per deployment
    # on held-out data (the production values are not published). None = raw sigmoid(z_k).
    confidence_temperature: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise InputError(f"DSpark schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "auto" and self.sps is None:
            raise InputError("DSpark schedule 'auto' needs a ThroughputTable (engine.dspark.profile.load_or_profile)")
        if not 0.0 <= self.threshold <= 1.0:
            raise InputError(f"DSpark threshold must lie in [0, 1], got {self.threshold}")
        t = self.confidence_temperature
        if t is not None and not all(isinstance(x, (int, float)) and x > 0 and math.isfinite(x) for x in t):
            raise InputError(f"DSpark confidence_temperature must be positive numbers, one per draft, got {t!r}")

    @classmethod
    def from_settings(cls, schedule: str, threshold: float = 0.5, model=None,
                      on_profiled: Callable[[Path], None] | None = None) -> DSparkConfig:
        """The config a user's settings name. "auto" needs the model: its steps/s table for this machine is
        loaded, or profiled (once, and again after a change of the model or the engine code) and stored (then
        on_profiled(path) is called)."""
        sps = None
        if schedule == "auto":
            if model is None:
                raise InputError("DSpark schedule 'auto' needs the model to profile its throughput")
            if getattr(model, "world", None) is not None:  # each rank would profile alone, and schedule differently
                raise InputError("DSpark schedule 'auto' profiles one process; a torchrun launch uses 'all' or "
                                 "'threshold'")
            sps = stored_table(model)
            if sps is None:
                sps = profile_and_store(model)
                if on_profiled is not None:
                    on_profiled(table_path(model))
        return cls(schedule, threshold=threshold, sps=sps)

    def temperature(self, gamma: int) -> torch.Tensor | None:
        """[γ] per-position confidence temperatures, or None."""
        if self.confidence_temperature is None:
            return None
        if len(self.confidence_temperature) != gamma:
            raise InputError(f"DSpark confidence_temperature has {len(self.confidence_temperature)} values; the "
                             f"drafter proposes {gamma} tokens (dspark_block_size)")
        return torch.tensor(self.confidence_temperature, dtype=torch.float32)

    def fallback(self) -> PlainFallback | None:
        """A run's state for the auto schedule's plain steps (engine.dspark.fallback.PlainFallback), or None: other
        schedules, plain_fallback off, or a table without the drafter's costs always draft."""
        if self.schedule != "auto" or not self.plain_fallback or not self.sps.draft_rows:
            return None
        return PlainFallback(self.sps)

    def calibration(self, gamma: int) -> OnlineCalibration | None:
        """A run's online calibration of the confidences the auto schedule reads, or None: other schedules,
        calibrate off, or a table without the drafter's costs (one made by hand: the paper's Alg. 1 on the raw
        confidences; a profiled table brings the calibration and the plain steps it judges with)."""
        if self.schedule != "auto" or not self.calibrate or not self.sps.draft_rows:
            return None
        return OnlineCalibration(gamma)

    def lengths(self, confidence: torch.Tensor, least: int = 0, block_over_plain: float | None = None) -> list[int]:
        """Drafts to verify per request, from confidences [R, γ]; at least `least` each. block_over_plain (auto, with
        a fixed-width verify block and a plain forward to choose from): the block's seconds over the plain forward's,
        and the choice is every draft or none (schedule_block)."""
        if self.schedule == "all":
            return schedule_all(confidence)
        if self.schedule == "auto" and block_over_plain is not None:
            return schedule_block(confidence, block_over_plain)
        if self.schedule == "threshold":
            return [max(least, ell) for ell in schedule_threshold(confidence, self.threshold)]
        return schedule_throughput(confidence, self.sps, early_stop=self.early_stop, least=least)
