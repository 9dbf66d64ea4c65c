"""The engine service and RemoteEngine: what the app gets through them equals what the Engine gives in process."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.generation import DSparkConfig, Engine
from engine.request import GenerationRequest
from engine.serving import RemoteEngine, serve
from engine.serving.client import ServiceGone
from engine.spec.errors import EngineError, InputError
from engine.trace import Trace, TraceBudget

ROOT = Path(__file__).resolve().parents[2]
TIMES = ("time", "step_time")  # wall-clock columns differ from run to run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_traces_match(want: Trace, got: Trace, tol: float) -> None:
    """Every table and column equal (floats within tol), except wall-clock times."""
    (wt, wh), (gt, gh) = want.to_tables(), got.to_tables()
    assert sorted(wt) == sorted(gt) and wh["meta"] == gh["meta"]
    for table, columns in wt.items():
        assert sorted(columns) == sorted(gt[table]), table
        for name, w in columns.items():
            if any(t in name for t in TIMES):
                continue
            g = gt[table][name]
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=0, atol=tol, err_msg=f"{table}.{name}")
            else:
                assert np.array_equal(g, w), f"{table}.{name}"


def generate_both(engine, remote_or_engine, **kw):
    trace = Trace(TraceBudget(attention=True), meta={"prompt": "hello there"})
    pieces = []
    request = GenerationRequest.of(8, trace=trace, dspark=DSparkConfig(), **kw)
    out = remote_or_engine.generate_text("hello there", request, on_text=lambda _row, piece: pieces.append(piece))
    return out, trace, "".join(pieces)


@pytest.mark.slow  # an engine service in a thread, and the same DSpark run in process [6 s at load average 9]
def test_remote_engine_gives_what_the_engine_gives(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))   # where this start's key file goes
    monkeypatch.delenv("ENGINE_SERVICE_KEY", raising=False)
    torch.set_num_threads(1)
    engine = Engine.load("tiny-v4.1")
    port = free_port()
    ready = threading.Event()
    service = threading.Thread(target=serve, args=(engine, None),
                               kwargs=dict(port=port, on_ready=lambda _a, _k: ready.set()), daemon=True)
    service.start()
    assert ready.wait(30)
    remote = RemoteEngine(f"127.0.0.1:{port}")
    assert remote.args == engine.args and remote.model is None and remote.source.startswith(engine.source)
    got, got_trace, streamed = generate_both(engine, remote)
    want, want_trace, _ = generate_both(engine, engine)
    assert got.texts == want.texts and streamed == want.texts[0]
    assert got.result.tokens == want.result.tokens and got.result.finish_reasons == want.result.finish_reasons
    assert [s.accepted for s in got.result.steps] == [s.accepted for s in want.result.steps]
    assert_traces_match(want_trace, got_trace, 0.0)
    from v41viz.ui.engine_session import load_slot
    app_choice = attach_app(f"127.0.0.1:{port}")
    slot = load_slot(app_choice)
    assert slot.engine.args == engine.args and slot.engine.model is None
    four = GenerationRequest.greedy(4)
    assert slot.engine.generate_text("hi", four).texts == engine.generate_text("hi", four).texts
    message = {"op": "generate", "prompts": [[0, 5]], "max_new_tokens": 2, "settings": {}, "dspark": None,
               "trace": None}
    with pytest.raises(InputError, match="max_new_tokens"):         # the service checks what a client sends
        remote.request({**message, "max_new_tokens": -1})
    with pytest.raises(InputError, match="settings.temprature: unknown field"):
        remote.request({**message, "settings": {"temprature": 1.0}})
    assert remote.request({**message, "settings": {"temperature": 1.0, "seed": 3}})["done"]["tokens"] == \
        engine.generate([[0, 5]], GenerationRequest.of(2, temperature=1.0, seed=3)).tokens
    with pytest.raises(InputError, match="'auto' profiles one process"):
        remote.generate([[0, 5]], GenerationRequest.of(2, dspark=DSparkConfig("auto", sps=object())))
    remote.shutdown()
    service.join(10)
    assert not service.is_alive() and not list(tmp_path.rglob("*.key"))   # the key file goes with the service


def attach_app(address: str):
    """The Inspect page's model choice for V41VIZ_ENGINE=address (the app's way to attach to a service)."""
    from unittest import mock

    from v41viz.ui.engine_session import SERVICE_ENV, model_choices
    with mock.patch.dict("os.environ", {SERVICE_ENV: address}):
        choices = model_choices()
    service = [c for c in choices.values() if c.service]
    assert [c.service for c in service] == [address] and next(iter(choices.values())) is service[0]
    return service[0]


def test_remote_engine_names_a_missing_service(monkeypatch):
    monkeypatch.setenv("ENGINE_SERVICE_KEY", "a-key-of-at-least-16-characters")
    with pytest.raises(ServiceGone, match="no engine service at 127.0.0.1:.*torchrun"):
        RemoteEngine(f"127.0.0.1:{free_port()}")


@pytest.mark.slow  # a 2-rank engine service under torchrun, and the same generation in process [37 s at load average 9]
def test_a_two_rank_service_serves_the_single_process_text_and_trace(tmp_path, monkeypatch):
    """The documented attachment: `torchrun --nproc-per-node 2 -m engine.serving …`, then RemoteEngine (the app)."""
    port = free_port()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ENGINE_SERVICE_KEY", raising=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "engine.serving", "--config", "tiny-v4.1", "--random-init", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        remote = None
        while remote is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                remote = RemoteEngine(f"127.0.0.1:{port}")
            except EngineError:     # not listening yet (ServiceGone), or its key file not written yet
                time.sleep(1)
        assert remote is not None, proc.communicate(timeout=30)[0][-3000:]
        assert remote.ranks == 2 and "split over 2 ranks" in remote.source
        engine = Engine.load("tiny-v4.1")
        got, got_trace, _ = generate_both(engine, remote)
        want, want_trace, _ = generate_both(engine, engine)
        assert got.texts == want.texts and got.result.tokens == want.result.tokens
        assert_traces_match(want_trace, got_trace, 1e-4)     # fp32: all-reduce order (tests/parallel/test_parallel.py)
        remote.shutdown()
        code = proc.wait(60)
        assert code == 0, proc.stdout.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()          # torchrun ends its ranks; ranks whose launcher dies end themselves
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
