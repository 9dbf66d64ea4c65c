"""Shared test set-up: the slow stage, and the browser fixtures (a live Streamlit server, headless Chromium)."""
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
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

# The slow stage (`pytest -m slow`, run second by scripts/test.sh): whole files, or single tests as file::name, each
# with why. Chosen from a `--durations=0` run of the full suite on the shared 2-core machine (seconds in brackets);
# everything else is the fast stage, which must stay under 3 minutes there.
SLOW = {
    # browser: a live Streamlit server driven by headless Chromium
    "test_e2e_architecture.py": "browser tests [52 s]",
    "test_e2e_inspect.py": "browser tests [85 s]",
    "test_e2e_inspect_actions.py": "browser tests of user actions on the Inspect page [90 s]",
    "test_e2e_architecture_actions.py": "browser tests of user actions on Architecture and the sidebar [~110 s]",
    # model-card measurement
    "test_default_checkpoint.py": "re-measures the shipped model's card [29 s]",
    "test_model_card.py": "measures a card end to end on a tiny checkpoint [9 s]",
    # long training runs
    "test_train_drafter.py": "trains and resumes a drafter [8 s]",
    "test_continuations.py": "greedy continuations of training prompts, and drafter training on them [25 s]",
    # long equivalence and statistics runs (the kernel ones: a whole model in the Triton interpreter)
    "test_dspark_distribution.py": "a chi-square test over 1000 sampled rows, and its power check [14 s]",
    "test_graphs.py::test_static_body_decodes_like_eager_step_by_step": "24+ decode steps, twice [12 s]",
    "test_graphs.py::test_greedy_dspark_with_graphs_equals_eager": "four speculative runs, twice each [9 s]",
    "test_kernels_engine.py::test_kernel_engine_matches_reference_prefill_and_decode": "Triton interpreter [6 s]",
    "test_kernels_engine.py::test_cli_generate_with_triton_kernels_prints_the_reference_text": "the same [6 s]",
    # host memory measured on a large official-format checkpoint
    "test_official_memory.py": "writes a 257 MiB and a 1 GiB official checkpoint, loads and generates from them in "
                               "fresh processes, measuring RSS [11 s + 35 s]",
    "test_official_checkpoint.py": "writes, reads and breaks tiny official-format checkpoints, generates from "
                                   "them [15 s]",
    "test_kernels_quant.py": "FP8 / FP4 GEMMs in the Triton interpreter, many shapes [9 s]",
    "test_app_inspect.py::test_an_official_fp8_folder_is_picked_and_generates":
        "quantizes the shipped model, then loads and generates from it in the page [10 s]",
}


def pytest_collection_modifyitems(config, items):
    """Mark the tests listed in SLOW; a listed name that matches nothing is an error, not a test silently made fast."""
    stale = [key for key in SLOW if not (ROOT / "tests" / key.partition("::")[0]).exists()]
    unmatched = {key for key in SLOW if "::" in key}
    collected_files = set()
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        collected_files.add(file)
        if file in SLOW or test in SLOW:
            item.add_marker(pytest.mark.slow)
            unmatched.discard(test)
    stale += sorted(key for key in unmatched if key.partition("::")[0] in collected_files)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")


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
