"""A corpus of malformed, oversized, out-of-order and truncated messages, and clients that vanish mid-stream, sent
to a running 2-rank service (gloo, CPU): it answers or drops each, never exits, and a well-formed request afterwards
still returns the text it returned before."""
from __future__ import annotations

import json
import os
import random
import re
import socket
import struct
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from engine.generation import DSparkConfig
from engine.request import GenerationRequest
from engine.serving.key import client_key
from engine.serving.listener import CLIENT_TIMEOUT_S
from engine.serving.schema import MAX_REQUEST_BYTES
from engine.trace import Trace, TraceBudget
from tests.service_helpers import ROOT, attach, free_port, launch, output, rank_pids, stop

pytestmark = pytest.mark.slow  # a 2-rank service, ~140 messages, two stalled clients [100 s at load average 5]

GOOD = {"op": "generate", "prompts": [[0, 5, 9]], "max_new_tokens": 2, "settings": {"temperature": 0.0},
        "dspark": None, "trace": {"budget": {"max_tokens": 8, "attention": True}, "meta": {}}}
REFUSALS: list[str] = []   # the error of every refused message
# a refusal names the field it is about ("settings.bogus: …", "prompts[0][1]: …"), or says the message is no request
NAMES_THE_FIELD = re.compile(r"^(\S+: |the request is not JSON|the request holds |a request must)")
VALUES = [None, True, False, -1, 0, 3, 10**30, 1.5, -2.5, "", "x", "layers.0", [], [[]], [-5], [0, "a"], {},
          {"a": 1}, {"op": "hello"}, [[0, 1], [2]], "A" * 5000]


def mutations(rng: random.Random, n: int) -> list[dict]:
    """n requests, each GOOD with one field (at any depth) replaced, removed, or joined by an unknown one."""
    out = []
    for _ in range(n):
        message = json.loads(json.dumps(GOOD))
        holder = rng.choice([message, message["settings"], message["trace"], message["trace"]["budget"]])
        action = rng.random()
        if action < 0.7 and holder:
            holder[rng.choice(sorted(holder))] = rng.choice(VALUES)
        elif action < 0.85 and holder:
            del holder[rng.choice(sorted(holder))]
        else:
            holder[rng.choice(["path", "bogus", "Op", "__class__", ""])] = rng.choice(VALUES)
        out.append(message)
    return out


def exchange(port: int, frames: list[bytes], key: bytes, read: int | None = None) -> str:
    """Authenticate, send the frames as messages, read the replies (at most `read` of them, then vanish):
    'refused' (an error naming the problem came back), 'answered' (a result) or 'dropped' (the service closed the
    connection)."""
    conn = Client(("127.0.0.1", port), authkey=key)
    try:
        for frame in frames:
            conn.send_bytes(frame)
        got = 0
        while read is None or got < read:
            reply = json.loads(conn.recv_bytes())
            got += 1
            if "error" in reply:
                REFUSALS.append(reply["error"])
                return "refused"
            if "done" in reply or "hello" in reply:
                return "answered"
        return "vanished"
    except (OSError, EOFError):
        return "dropped"
    finally:
        conn.close()


def wrong_key(port: int) -> str:
    try:
        Client(("127.0.0.1", port), authkey=b"not-the-key-not-the-key").close()
    except AuthenticationError:
        return "dropped"
    return "answered"


def raw(port: int, data: bytes, linger_s: float = 0.0) -> None:
    """Bytes on a bare socket (no key exchange), then wait linger_s and go."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        if data:
            s.sendall(data)
        time.sleep(linger_s)


def truncated(port: int, key: bytes, stall_s: float) -> str:
    """Announce a 1,000-byte message, send 10 bytes, and stall (or go at once)."""
    conn = Client(("127.0.0.1", port), authkey=key)
    try:
        os.write(conn.fileno(), struct.pack("!i", 1000) + b'{"op": "ge')
        time.sleep(stall_s)
        conn.recv_bytes()
        return "answered"
    except (OSError, EOFError):
        return "dropped"
    finally:
        conn.close()


def reference_run(remote) -> tuple[list[list[int]], dict]:
    trace = Trace(TraceBudget(attention=True), meta={"prompt": "fuzz"})
    result = remote.generate([[0, 5, 9]], GenerationRequest.of(6, trace=trace, dspark=DSparkConfig()))
    return result.tokens, {name: len(col) for name, col in trace.to_tables()[0]["tokens"].items()}


def test_the_service_answers_or_drops_every_bad_message_and_keeps_serving(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ENGINE_SERVICE_KEY", raising=False)
    config = json.loads((ROOT / "configs" / "tiny-v4.1.json").read_text())
    (tmp_path / "tiny-64.json").write_text(json.dumps({**config, "max_seq_len": 64}))   # the longest run: 61 tokens
    port = free_port()
    proc = launch(2, port, tmp_path, "--config", str(tmp_path / "tiny-64.json"), "--random-init")
    pids = {}
    try:
        remote = attach(port, proc)
        pids = rank_pids(proc)
        key = client_key(port)
        before = reference_run(remote)
        outcomes: dict[str, list[str]] = {}

        def record(kind: str, outcome: str) -> None:
            outcomes.setdefault(kind, []).append(outcome)
            assert proc.poll() is None, f"the service exited after a {kind} message: {output(proc)}"

        start = time.monotonic()
        for message in mutations(random.Random(0), 120):
            record("mutated", exchange(port, [json.dumps(message).encode()], key))
        for frame in [b"", b"\xff\xfe", b"{", b"[" * 200_000, b"null", b"[]", b'"generate"', b"1e999",
                      b'{"op": "generate", "prompts": [[0]], "max_new_tokens": 1, "settings": {"top_p": NaN}}',
                      b'{"op": "hello", "op": "generate"}', b'{"token": [0, 1, {}]}', b'{"done": null}']:
            record("malformed", exchange(port, [frame], key))
        record("oversized", exchange(port, [b" " * (MAX_REQUEST_BYTES + 1)], key))
        record("out of order", exchange(port, [json.dumps(GOOD).encode()] * 2, key))          # two on one line
        record("out of order", exchange(port, [json.dumps({"op": "hello"}).encode(),
                                               json.dumps({"op": "shutdown"}).encode()], key))  # 2nd never read
        raw(port, struct.pack("!i", 20) + b'{"op": "shutdown"}..')                   # before the key exchange
        record("out of order", "dropped")
        record("wrong key", wrong_key(port))
        record("truncated", truncated(port, key, 0.0))
        record("vanished", exchange(port, [json.dumps({**GOOD, "max_new_tokens": 20}).encode()], key, read=2))
        record("vanished", exchange(port, [json.dumps({**GOOD, "max_new_tokens": 20}).encode()], key, read=0))
        raw(port, b"")                                                               # connects, goes at once
        record("vanished", "dropped")
        stalled = time.monotonic()
        raw(port, b"", linger_s=CLIENT_TIMEOUT_S + 1)                                # says nothing, stays
        record("stalled", truncated(port, key, CLIENT_TIMEOUT_S + 1))                # half a message, stays
        stalled_s = time.monotonic() - stalled
        corpus_s = time.monotonic() - start
        assert reference_run(remote) == before
        assert remote.ranks == 2 and proc.poll() is None
        summary = {kind: {o: found.count(o) for o in sorted(set(found))} for kind, found in outcomes.items()}
        print(f"\nfuzz: {sum(map(len, outcomes.values()))} messages in {corpus_s:.1f} s "
              f"(stalled clients {stalled_s:.1f} s): {summary}")
        assert len(REFUSALS) == sum(found.count("refused") for found in outcomes.values())
        assert not [e for e in REFUSALS if not NAMES_THE_FIELD.match(e)], REFUSALS
        known = ("refused", "answered", "dropped", "vanished")
        assert not [o for found in outcomes.values() for o in found if o not in known]
        assert set(outcomes["oversized"]) == {"dropped"} and set(outcomes["malformed"]) == {"refused"}
        remote.shutdown()
        assert proc.wait(60) == 0, output(proc)
    finally:
        stop(proc, pids)
