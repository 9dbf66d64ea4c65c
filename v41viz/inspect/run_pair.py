"""Two generations run one after the other in the background (the Compare page's A and B), each through the
engine's turn-taking like an Inspect run, so Stop and the queue behave the same."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from . import background
from .run import GenSettings, LiveRun, new_trace


@dataclass
class RunPair:
    a: LiveRun
    b: LiveRun
    thread: threading.Thread | None = field(default=None, repr=False, compare=False)

    @property
    def active(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def runs(self) -> tuple[LiveRun, LiveRun]:
        return self.a, self.b

    def stop(self, wait_s: float = 30.0) -> None:
        """Stop whichever run is going; a B that has not started yet never starts."""
        for run in self.runs:
            run.stop_requested.set()
        for run in self.runs:
            if run.thread is not None:
                background.stop(run, wait_s)
        if self.thread is not None:
            self.thread.join(wait_s)


def new_run(slot, settings: GenSettings) -> LiveRun:
    """A live run of the slot's model with a trace carrying the model's facts (as the Inspect page makes one)."""
    trace = new_trace(settings, slot.choice.key, slot.engine.source, slot.args)
    return LiveRun(trace, slot.choice.key, prompt=settings.prompt, max_new_tokens=settings.max_new_tokens)


def start_pair(slot_a, settings_a: GenSettings, slot_b, settings_b: GenSettings) -> RunPair:
    """Run A, then B (never both at once: on a small machine the second would slow the first), each waiting for
    its engine's turn like any other session's generation."""
    pair = RunPair(new_run(slot_a, settings_a), new_run(slot_b, settings_b))

    def body() -> None:
        background.start(slot_a, settings_a, pair.a).join()
        if pair.a.stop_requested.is_set() or pair.b.stop_requested.is_set():
            pair.b.status, pair.b.stopped_by = "stopped", "you"
            pair.b.trace.meta["finish"] = "stopped"
            pair.b.finished_at = time.perf_counter()
            return
        pair.b.started = time.perf_counter()   # B's timings count from its own start, not from the click
        background.start(slot_b, settings_b, pair.b).join()

    pair.thread = threading.Thread(target=body, name=f"compare-pair-{pair.a.serial}", daemon=True)
    pair.thread.start()
    return pair
