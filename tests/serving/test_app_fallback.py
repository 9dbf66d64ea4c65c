"""The app attached to a service (V41VIZ_ENGINE) whose service ends: the Inspect page says the service is gone and
keeps working with a model of its own process."""
from __future__ import annotations

import threading

import pytest
import torch

from engine.generation import Engine
from engine.serving import RemoteEngine, serve
from tests.app.test_app_inspect import generate, inspect_page, text_of
from tests.service_helpers import free_port
from v41viz.ui.engine_session import SERVICE_ENV


@pytest.mark.slow  # a service in a thread, the Inspect page on it, then on the shipped model [40 s at load average 5]
def test_the_inspect_page_goes_on_with_a_local_model_when_the_service_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ENGINE_SERVICE_KEY", raising=False)
    monkeypatch.setenv("V41VIZ_CPU_KERNELS", "0")   # not waiting on a C++ build another process may hold
    torch.set_num_threads(1)
    port, ready = free_port(), threading.Event()
    service = threading.Thread(target=serve, args=(Engine.load("tiny-v4.1"), None), daemon=True,
                               kwargs=dict(port=port, on_ready=lambda _a, _k: ready.set()))
    service.start()
    assert ready.wait(60)
    address = f"127.0.0.1:{port}"
    monkeypatch.setenv(SERVICE_ENV, address)
    at = generate(inspect_page(model=f"service:{address}"), max_new=3)
    assert not at.exception, at.exception
    assert at.selectbox(key="inspect_model").value == f"service:{address}"
    assert "status: **stopped at max new tokens (3 tokens)**" in text_of(at)
    RemoteEngine(address).shutdown()
    service.join(30)
    at = generate(at, max_new=3)            # the run fails: the service is gone
    at.run()                                # the next draw: the page says so and runs the shipped model
    assert not at.exception, at.exception
    assert any(w.value.startswith(f"The engine service is gone (no engine service at {address}") and
               "this page runs" in w.value for w in at.warning), ([w.value for w in at.warning],
                                                                  [e.value for e in at.error], text_of(at)[:2000])
    assert at.selectbox(key="inspect_model").value == "checkpoint:default"
    assert f"service:{address}" not in at.selectbox(key="inspect_model").options
    at = generate(at, max_new=3)
    assert not at.exception, at.exception
    assert "status: **stopped at max new tokens (3 tokens)**" in text_of(at)
