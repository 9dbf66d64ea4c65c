"""DSpark aggregates from step records, and the profiled throughput table's storage."""
import json
import math

import pytest
import torch

from engine.dspark.metrics import summarize
from engine.dspark.profile import (
    convex_minorant,
    load_or_profile,
    load_table,
    monotone_decreasing,
    profile_throughput,
    save_table,
    table_key,
    table_path,
    table_points,
)
from engine.dspark.schedule import ThroughputTable
from engine.trace import DSparkStep
from tests.model_helpers import tiny_model


def step(row, n, verify_len, accepted, survival, t=0.1):
    return DSparkStep(row=row, step=n, anchor_pos=10 + n, anchor_token=3, drafted=[4, 5, 6], draft_probs=[1, 1, 1],
                      confidences=survival, survival=survival, verify_len=verify_len, accepted=accepted,
                      next_token=7, next_kind="bonus" if accepted == verify_len else "replacement", time_s=t)


def test_summary_counts_acceptance_by_position_and_calibration():
    steps = [step(0, 1, 3, 3, [0.9, 0.8, 0.4]),   # all three accepted + bonus
             step(1, 1, 3, 1, [0.7, 0.6, 0.2]),   # first accepted, second rejected
             step(0, 2, 2, 0, [0.5, 0.3, 0.1]),   # first rejected
             step(1, 2, 0, 0, [0.2, 0.1, 0.0])]   # nothing scheduled: the target token is a bonus
    m = summarize(steps, target_forwards=2, decode_s=0.5)
    assert (m.steps, m.drafted, m.scheduled, m.accepted, m.bonus) == (4, 12, 8, 4, 2)
    assert m.mean_accepted_length == pytest.approx((4 + 2 + 1 + 1) / 4)
    assert m.acceptance_rate == pytest.approx(4 / 8) and m.tokens_per_forward == pytest.approx(8 / 2)
    # draft 1 reached in 3 steps, kept in 2; draft 2 reached in 2, kept in 1; draft 3 reached once, kept once
    assert m.conditional_acceptance == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert m.calibration_n == [3, 3, 2]
    assert m.predicted_survival == pytest.approx([(0.9 + 0.7 + 0.5) / 3, (0.8 + 0.6 + 0.3) / 3, (0.4 + 0.2) / 2])
    assert m.observed_survival == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert m.mean_step_s == pytest.approx(0.25)
    assert summarize(steps).target_forwards == 2 and summarize(steps).mean_step_s == pytest.approx(0.1)
    assert math.isnan(summarize([]).mean_accepted_length)


def test_throughput_table_is_profiled_once_and_stored(tmp_path):
    model = tiny_model(dtype=torch.float32, vocab_size=64, dspark_noise_token_id=63)
    calls = []
    table = profile_throughput(model, max_batch=2, repeats=1, context=4, on_progress=lambda *a: calls.append(a))
    # progress after every verify shape timed, warm-up round included: 2 rounds × 12 shapes
    assert calls[0] == (0, 24) and calls[-1] == (24, 24) and [d for d, _ in calls] == list(range(25))
    # R rows × s tokens for R in {1, 2}, s in 1..γ+1
    assert table.batch_tokens == sorted({r * s for r in (1, 2) for s in range(1, 7)})
    assert all(v > 0 for v in table.steps_per_second) and table.meta["max_batch"] == 2
    # non-increasing steps/s, and the drafter timed per batch of rows (the auto schedule weighs it against plain steps)
    assert all(b <= a for a, b in zip(table.steps_per_second, table.steps_per_second[1:]))
    assert table.draft_rows == [1, 2] and all(s > 0 for s in table.draft_seconds)
    assert table.draft_cost(1) == table.draft_seconds[0] and table.meta["key"] == table_key(model)
    save_table(table, tmp_path / "t.json")
    assert load_table(tmp_path / "t.json") == table
    path = table_path(model, tmp_path)
    assert path.name.startswith("sps-") and path.name.endswith("tiny-v4.1.json")
    stored = ThroughputTable([1, 2], [5.0, 4.0], meta={"key": table_key(model)})   # made for this machine and code
    save_table(stored, path)
    assert load_or_profile(model, tmp_path) == stored            # found: not profiled again
    save_table(ThroughputTable([1], [5.0], meta={"threads": 99, "dtype": "torch.float32"}), path)
    fresh = load_or_profile(model, tmp_path, max_batch=1, repeats=1, context=4)
    assert fresh.batch_tokens == list(range(1, 7)) and load_table(path) == fresh
    # a change of the engine code (or of the config, dtype, options, threads, torch, hardware) profiles again
    save_table(ThroughputTable([1], [5.0], meta={"key": {**table_key(model), "code": "0" * 16}}), path)
    assert load_or_profile(model, tmp_path, max_batch=1, repeats=1, context=4).batch_tokens == list(range(1, 7))
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a throughput table"):
        load_table(path)


def test_profiled_points_are_monotone_and_convex_for_one_row():
    """More batch tokens never make a step faster (a measured rise is noise, pooled with its neighbours), and one
    row's step times are convex in its tokens from two on (a bump above the lower hull is noise that would stop
    Alg. 1's early-stopped search short); counts beyond one row's block take their fastest shape."""
    assert monotone_decreasing([10.0, 12.0, 8.0, 9.0, 3.0]) == pytest.approx([11.0, 11.0, 8.5, 8.5, 3.0])
    assert monotone_decreasing([5.0, 4.0, 4.0]) == [5.0, 4.0, 4.0]
    assert convex_minorant([1, 2, 3, 4], [1.0, 4.0, 4.0, 5.0]) == pytest.approx([1.0, 2.0 + 1 / 3, 3 + 2 / 3, 5.0])
    seconds = {(1, 1): 0.020, (1, 2): 0.028, (1, 3): 0.032, (1, 4): 0.034, (1, 5): 0.041, (1, 6): 0.041,
               (2, 3): 0.030, (2, 4): 0.046, (2, 5): 0.040}
    xs, sps = table_points(seconds)
    times = [1 / v for v in sps]
    assert xs == [1, 2, 3, 4, 5, 6, 8, 10]
    # one token as measured; from two on the lower hull through (2, 0.028), (4, 0.034) and (6, 0.041)
    assert times[:6] == pytest.approx([0.020, 0.028, 0.031, 0.034, 0.0375, 0.041])
    assert times[6:] == pytest.approx([0.046, 0.046])                               # 10: 0.040, never below 8's
