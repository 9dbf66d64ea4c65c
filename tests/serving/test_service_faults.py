"""Faults in a 2-rank service (gloo, CPU): a rank killed mid-generation, a rank that stops responding, a rank whose
shard is truncated. Every rank ends within the stated time (docs/parallelism.md), rank 0 (or every rank, at load)
says which rank failed and why in one line, the client is told the service is gone, and no rank process remains."""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from engine.request import GenerationRequest
from engine.serving import RemoteEngine
from engine.serving.client import ServiceGone
from tests.model_helpers import tiny_args
from tests.official_helpers import write_tiny_official
from tests.service_helpers import alive, attach, free_port, launch, output, rank_errors, rank_pids, stop

pytestmark = pytest.mark.slow  # each launches a 2-rank service under torchrun [16-55 s each at load average 5]

TIMEOUT_S = 3            # ENGINE_DIST_TIMEOUT_S of these launches: how long a collective waits for a silent rank
LAUNCHER_GRACE_S = 30    # torchrun's wait between its SIGTERM and its SIGKILL (a frozen rank takes the SIGKILL)


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ENGINE_SERVICE_KEY", raising=False)
    return tmp_path


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


def fault_mid_generation(tmp_path: Path, fault: int) -> tuple[str, float, dict, dict]:
    """Start the service, generate until the 3rd token, send `fault` (a signal) to rank 1, and return the client's
    error, the seconds from the fault until the launcher and every rank had ended, the ranks' pids and stderr."""
    port = free_port()
    proc = launch(2, port, tmp_path, "--config", "tiny-v4.1", "--random-init",
                  env={"ENGINE_DIST_TIMEOUT_S": str(TIMEOUT_S)})
    pids = {}
    try:
        remote = attach(port, proc)
        pids = rank_pids(proc)
        tokens, sent = [], []

        def on_token(_row, token, _info) -> None:
            tokens.append(token)
            if len(tokens) == 3:
                os.kill(pids[1], fault)
                sent.append(time.monotonic())

        with pytest.raises(ServiceGone) as gone:
            remote.generate([[0, 5, 9]], GenerationRequest.of(400, stop_tokens=()), on_token=on_token)
        assert sent, "the generation ended before the fault"
        proc.wait(TIMEOUT_S + LAUNCHER_GRACE_S + 60)
        while any(alive(pid) for pid in pids.values()) and time.monotonic() - sent[0] < 120:
            time.sleep(0.1)
        ended_s = time.monotonic() - sent[0]
        assert not [r for r, pid in pids.items() if alive(pid)], "a rank process remains"
        assert proc.returncode != 0, output(proc)
        with pytest.raises(ServiceGone, match="no engine service at"):   # its key file is gone with it
            remote.request({"op": "hello"})
        return str(gone.value), ended_s, pids, rank_errors(tmp_path)
    finally:
        stop(proc, pids)


def test_a_rank_killed_mid_generation_ends_the_service_naming_it(key_home):
    message, ended_s, _, errs = fault_mid_generation(key_home, signal.SIGKILL)
    print(f"\nkilled rank 1: every rank ended {ended_s:.1f} s after the kill; the client got: {message}")
    assert message.startswith("the engine service has ended: rank 1 of 2 is gone: its process ended"), message
    assert error_lines(errs[0]) == [f"error: {message}"], errs[0]
    assert ended_s < 15


def test_a_rank_that_stops_responding_ends_the_service_naming_it(key_home):
    message, ended_s, _, errs = fault_mid_generation(key_home, signal.SIGSTOP)
    print(f"\nfrozen rank 1: every rank ended {ended_s:.1f} s after SIGSTOP; the client got: {message}")
    assert message.startswith(f"the engine service has ended: rank 1 of 2 did not answer within {TIMEOUT_S} s"), \
        message
    assert error_lines(errs[0]) == [f"error: {message}"], errs[0]
    assert ended_s < 2 * TIMEOUT_S + LAUNCHER_GRACE_S + 15


def test_a_rank_whose_shard_is_truncated_ends_every_rank_before_serving(key_home):
    """A shard only rank 1 reads, cut short: both ranks end with the same line naming rank 1 and the shard, and
    no service ever listens."""
    from tests.parallel.test_official_parallel import SPLITS_FOUR_WAYS, own_shard
    folder = key_home / "broken"
    write_tiny_official(folder, tiny_args(**SPLITS_FOUR_WAYS), shards=3)
    own_shard(folder, [f"layers.3.ffn.experts.{e}.w1.{leaf}" for e in (6, 7) for leaf in ("weight", "scale")],
              "rank1-experts.safetensors")
    shard = folder / "rank1-experts.safetensors"
    os.truncate(shard, shard.stat().st_size - 16)
    port = free_port()
    start = time.monotonic()
    proc = launch(2, port, key_home, "--checkpoint", str(folder))   # the default timeout: rank 0 loads its part
    try:
        proc.wait(120)
        ended_s = time.monotonic() - start
        errs = rank_errors(key_home)
        lines = [error_lines(errs[r]) for r in (0, 1)]
        print(f"\ntruncated shard: every rank ended {ended_s:.1f} s after the launch: {lines[0]}")
        assert proc.returncode != 0 and len(lines[0]) == 1 and lines[0] == lines[1], errs
        assert lines[0][0].startswith(f"error: rank 1 of 2 failed loading {folder}: {shard}: ")
        assert "truncated" in lines[0][0]
        with pytest.raises(ServiceGone, match="no engine service at"):
            RemoteEngine(f"127.0.0.1:{port}")
        assert not list(key_home.rglob("*.key"))
    finally:
        stop(proc)
    shutil.rmtree(folder)
