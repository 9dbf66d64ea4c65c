"""The run store (v41viz.inspect.run_store): a run saved as it generates opens again by its id after the writer is
gone (a refresh, a restart), a crash keeps the tokens generated up to then, the store stays within its bounds by
dropping the least recently used runs, and an id is never a path."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from engine.spec.errors import InputError
from engine.trace import Trace, TraceBudget
from v41viz.inspect import run_store
from v41viz.inspect.run_store import FINAL, PARTIAL, RECORD, RunStore


def live_trace(n_generated: int = 3, prompt: str = "ROMEO:") -> Trace:
    """A trace as a run leaves it: prompt tokens, then generated ones with their top-k (no model needed)."""
    trace = Trace(TraceBudget(top_k_logits=2), meta={"config": "tiny-v4.1", "prompt": prompt, "vocab_size": 512})
    trace.record_prompt(0, [0, 11, 12], ["<s>", "RO", "MEO:"])
    for i in range(n_generated):
        generate_one(trace, 3 + i)
    return trace


def generate_one(trace: Trace, pos: int) -> None:
    trace.record_token(0, pos, 20 + pos, f" w{pos}", step=pos - 3, step_time_s=0.01)
    rec = trace._tokens[0][pos]
    rec.top_ids, rec.top_logits, rec.top_probs = (np.array([20 + pos, 1]), np.array([2.0, 1.0], np.float32),
                                                  np.array([0.7, 0.3], np.float32))


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(tmp_path / "runs", max_bytes=10**6, max_runs=3)


def test_a_finished_run_opens_by_its_id_as_it_was(store):
    trace = live_trace()
    writer = store.begin(trace, "tiny-v4.1")
    trace.meta["finish"] = "length"
    writer.finish("done")
    assert sorted(p.name for p in (store.root / writer.run_id).iterdir()) == [RECORD, FINAL]
    again, entry = RunStore(store.root).open(writer.run_id)        # another store object: a restarted server
    assert again == trace and again.meta["finish"] == "length"
    assert (entry.model, entry.status, entry.n_tokens, entry.prompt) == ("tiny-v4.1", "done", 3, "ROMEO:")
    assert entry.bytes == store.size_bytes() > 0


def test_a_run_interrupted_by_a_crash_keeps_its_tokens(store, monkeypatch):
    trace = live_trace(1)
    writer = store.begin(trace, "tiny-v4.1")
    for pos in (4, 5):
        generate_one(trace, pos)
        writer.last = 0.0        # past the throttle
        writer.tokens()
    assert store.runs()[0].status == "running"
    monkeypatch.setattr(run_store, "_writing", set())    # the writer's process is gone
    got, entry = store.open(writer.run_id)
    assert entry.status == "interrupted" and entry.n_tokens == 3
    assert got.meta["finish"] == "interrupted" and got.meta["prompt"] == "ROMEO:"
    assert [t.token_id for t in got.tokens(0)] == [0, 11, 12, 23, 24, 25]
    assert "".join(t.text for t in got.tokens(0) if t.generated) == " w3 w4 w5"
    assert not list((store.root / writer.run_id).glob("*.tmp"))   # every write renamed into place


def test_the_partial_file_is_throttled(store):
    trace = live_trace(1)
    writer = store.begin(trace, "m")
    before = (store.root / writer.run_id / PARTIAL).stat().st_mtime_ns
    generate_one(trace, 4)
    writer.tokens()                   # within PARTIAL_EVERY_S of the first write: skipped
    assert (store.root / writer.run_id / PARTIAL).stat().st_mtime_ns == before


def test_the_least_recently_used_runs_go_first(store):
    ids = []
    for i in range(5):
        writer = store.begin(live_trace(prompt=f"p{i}"), "m")
        writer.finish("done")
        ids.append(writer.run_id)
        past = time.time() - 100 + i
        os.utime(store.root / writer.run_id / RECORD, (past, past))
        if i == 1:
            store.open(ids[0])       # used again: now newer than runs 1 and 2
    assert len(store.runs()) == 3 and ids[4] in {e.run_id for e in store.runs()}
    kept = {e.run_id for e in store.runs()}
    assert ids[1] not in kept and ids[2] not in kept


def test_the_byte_bound_holds(tmp_path):
    store = RunStore(tmp_path / "runs", max_bytes=1, max_runs=100)
    for _ in range(3):
        store.begin(live_trace(), "m").finish("done")
    assert len(store.runs()) == 1    # only the run just saved: it is never dropped by its own save


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc", "0123456789ABCDEF", "0123", "", "0" * 17, None])
def test_an_id_is_never_a_path(store, bad):
    with pytest.raises(InputError, match="is not a run id"):
        store.open(bad)


def test_an_unknown_or_damaged_run_is_a_clear_error(store):
    with pytest.raises(InputError, match=r"run 0123456789abcdef is not in the run store"):
        store.open("0123456789abcdef")
    writer = store.begin(live_trace(), "m")
    writer.finish("done")
    (store.root / writer.run_id / FINAL).write_bytes(b"not a zip")
    with pytest.raises(InputError, match=rf"run {writer.run_id} in the run store cannot be read: .*not a zip file"):
        store.open(writer.run_id)


def test_the_default_folder_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(run_store.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert run_store.default_root() == tmp_path / "v41viz" / "runs"
    monkeypatch.setenv(run_store.ENV, str(tmp_path / "elsewhere"))
    assert RunStore().root == tmp_path / "elsewhere"
