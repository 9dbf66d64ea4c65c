"""engine.parallel.health on three rank threads: rank 0 names the rank that stopped answering, not the one that
answered."""
from __future__ import annotations

import time

from engine.parallel.health import answer_rank_zero, silent_ranks
from tests.parallel_helpers import run_ranks


def test_rank_zero_names_the_rank_that_stopped_answering():
    def work(world):
        if world.rank == 0:
            return silent_ranks(world, world.group, 0.3)
        if world.rank == 2:
            answer_rank_zero(world.group, 0.3)
        else:
            time.sleep(0.5)   # frozen past rank 0's wait
        return None

    results, errors = run_ranks(3, work, timeout_s=5)
    assert not errors, errors
    assert results[0] == ["rank 1 of 3 did not answer within 0.3 s (stopped responding)"]
