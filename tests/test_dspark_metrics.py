"""DSpark aggregates from step records, and the profiled throughput table's storage."""
import json
import math

import pytest
import torch

from engine.dspark.metrics import summarize
from engine.dspark.profile import load_or_profile, load_table, profile_throughput, save_table, table_path
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
    table = profile_throughput(model, max_batch=2, repeats=1, context=4)
    # R rows × s tokens for R in {1, 2}, s in 1..γ+1
    assert table.batch_tokens == sorted({r * s for r in (1, 2) for s in range(1, 7)})
    assert all(v > 0 for v in table.steps_per_second) and table.meta["max_batch"] == 2
    save_table(table, tmp_path / "t.json")
    assert load_table(tmp_path / "t.json") == table
    path = table_path(model, tmp_path)
    assert path.name.startswith("sps-") and path.name.endswith("tiny-v4.1.json")
    stored = ThroughputTable([1, 2], [5.0, 4.0], meta={"threads": torch.get_num_threads(), "dtype": "torch.float32"})
    save_table(stored, path)
    assert load_or_profile(model, tmp_path) == stored            # found: not profiled again
    save_table(ThroughputTable([1], [5.0], meta={"threads": 99, "dtype": "torch.float32"}), path)
    fresh = load_or_profile(model, tmp_path, max_batch=1, repeats=1, context=4)
    assert fresh.batch_tokens == list(range(1, 7)) and load_table(path) == fresh
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a throughput table"):
        load_table(path)
