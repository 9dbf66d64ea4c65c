"""Shared test set-up: the browser fixtures (a live Streamlit server, headless Chromium) and the card inputs.

Three stages (scripts/test.sh). The fast one, `pytest -m "not slow" -n 2 --dist loadfile` (two workers, whole files
each), must finish in under 3 minutes on a 2-core machine. The slow one, on two workers too, is every test marked slow
where it is written (`pytestmark = pytest.mark.slow` in a module, `@pytest.mark.slow` on a test, each with why and its
measured seconds), except the full-width rehearsal's (marked full_width too), which run last, one at a time. A test that
takes more than a few seconds of the fast stage is made cheaper, or marked slow saying why. Fast tests run beside each
other in two processes: what a test writes goes under tmp_path (of the engine's own caches, the Engram map in .cache/ is
written atomically, torch's extension cache under its lock), and what it changes in the environment, through
monkeypatch.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The app profiles the auto DSpark schedule in the background when it loads a drafter model (profile_ahead): in a
# short test process that never finishes, it only takes CPU from the tests; tests/inspect/test_profile_ahead.py
# runs it on purpose. Inherited by the test servers.
os.environ.setdefault("V41VIZ_PROFILE_AHEAD", "0")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]


@pytest.fixture(scope="session", autouse=True)
def _run_store(tmp_path_factory):
    """The app's run store (v41viz.inspect.run_store) in a folder of this test session, not the user's cache: set
    in the environment before any app or Streamlit server of the session starts, so they all inherit it."""
    os.environ["V41VIZ_RUN_STORE"] = str(tmp_path_factory.mktemp("run_store"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fresh `streamlit run app.py` per test module: yields (base URL, log path); waits for the health endpoint
    and always stops the process."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port",
             str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.time() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                        if r.read() == b"ok":
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("streamlit did not come up:\n" + log_path.read_text())
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}", log_path
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium under Playwright (scripts/test.sh installs it)."""
    from playwright import sync_api
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test.sh does it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """artifacts/screenshots/, where the browser tests leave what they saw."""
    path = ROOT / "artifacts" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def card_inputs(tmp_path_factory):
    """A tiny checkpoint and prepared data dir with the card measured on them (tests/card_helpers.py)."""
    from tests.card_helpers import build_card_inputs
    return build_card_inputs(tmp_path_factory.mktemp("card"))
