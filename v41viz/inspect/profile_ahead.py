"""The auto DSpark schedule's throughput table, profiled in the background as soon as the app loads a model with a
drafter, so that no one waits for it on their first `auto` run. It runs only while the engine is idle: a generation
that asks for the engine's turn stops it at once (it starts again when the engine is free)."""
from __future__ import annotations

import sys
import threading
import time
import traceback

from engine.dspark.profile import profile_and_store, stored_table

IDLE_POLL_S = 1.0
IDLE_BEFORE_S = 5.0     # idle this long (just loaded, or the last generation ended) before it starts
MAX_TRIES = 20          # each stopped by a generation that wanted the engine; then the first auto run profiles


class GenerationWaiting(Exception):
    """A generation asked for the engine while the profile held it."""


def profile_ahead(slot) -> threading.Thread | None:
    """Start profiling the slot's model for the auto schedule in a daemon thread, unless it has no drafter, runs as
    a service (the weights live in its ranks) or this machine already has its current table; the thread, or None."""
    model = slot.engine.model
    if model is None or not slot.args.has_dspark or stored_table(model) is not None:
        return None
    thread = threading.Thread(target=_profile_when_idle, args=(slot,), name="profile-ahead", daemon=True)
    thread.start()
    return thread


def _profile_when_idle(slot) -> None:
    model = slot.engine.model

    def give_way(_done: int, _total: int) -> None:
        if slot.waiting():
            raise GenerationWaiting

    for _ in range(MAX_TRIES):
        idle_since = time.perf_counter()
        while time.perf_counter() - idle_since < IDLE_BEFORE_S:   # idle for a while: not between Generate clicks
            if slot.busy or slot.waiting():
                idle_since = time.perf_counter()
            time.sleep(IDLE_POLL_S)
        try:
            with slot.turn():
                if stored_table(model) is None:    # an auto run may have profiled meanwhile
                    profile_and_store(model, on_progress=give_way)
                return
        except GenerationWaiting:
            continue
        except Exception:   # a failed profile must not take the app down: the first auto run profiles instead
            traceback.print_exc(file=sys.stderr)
            return
