"""The service's key (random per start, a 0600 file, no public default) and its listener (authenticated, and every
read bounded in time and size, so a stalled or hostile client cannot hold the ranks)."""
from __future__ import annotations

import os
import socket
import stat
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from engine.serving.key import KEY_ENV, client_key, key_file, remove_key, service_key
from engine.serving.listener import ServiceListener
from engine.spec.errors import InputError


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(KEY_ENV, raising=False)
    return tmp_path


def test_each_start_makes_a_random_key_only_its_user_can_read(key_home):
    first, path = service_key(8765)
    second, again = service_key(8765)
    assert path == again == key_home / "v41viz" / "engine-service-8765.key" and first != second and len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert client_key(8765) == second
    remove_key(path, first)            # another start's key: left in place
    assert path.exists()
    remove_key(path, second)
    assert not path.exists()
    with pytest.raises(InputError, match="no key for an engine service on port 8765"):
        client_key(8765)


def test_a_key_file_others_can_read_is_refused(key_home):
    _, path = service_key(9000)
    os.chmod(path, 0o644)
    with pytest.raises(InputError, match="readable by no one else"):
        client_key(9000)


@pytest.mark.parametrize("key", ["v41viz-local", "short"])
def test_a_published_or_short_key_is_refused(key_home, monkeypatch, key):
    monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(InputError, match=f"{KEY_ENV} must be a secret"):
        service_key(8765)
    assert not key_file(8765).exists()


def accept_in_thread(listener: ServiceListener) -> list:
    got = []
    thread = threading.Thread(target=lambda: got.append(listener.accept()), daemon=True)
    thread.start()
    got.append(thread)
    return got


def test_the_listener_drops_a_wrong_key_and_a_silent_client_and_bounds_reads():
    listener = ServiceListener(0, b"right-key-right-key", timeout_s=0.15)
    try:
        got = accept_in_thread(listener)
        with pytest.raises(AuthenticationError):
            Client(listener.address, authkey=b"wrong-key-wrong-key")
        got[0].join(5)
        assert got[1] is None
        got = accept_in_thread(listener)
        with socket.create_connection(listener.address):   # connects and says nothing: dropped after 0.15 s
            got[0].join(5)
            assert not got[0].is_alive() and got[1] is None
        got = accept_in_thread(listener)
        client = Client(listener.address, authkey=b"right-key-right-key")
        got[0].join(5)
        server = got[1]
        client.send_bytes(b"x" * 101)
        with pytest.raises(OSError, match="bad message length"):
            server.recv_bytes(100)
        client.close()
        got = accept_in_thread(listener)
        client = Client(listener.address, authkey=b"right-key-right-key")
        got[0].join(5)
        with pytest.raises(BlockingIOError):               # a request that never comes: the read gives up
            got[1].recv_bytes(100)
        client.close()
    finally:
        listener.close()
