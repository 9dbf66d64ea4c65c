"""Rank 0's listening socket: authenticated connections (multiprocessing.connection's HMAC challenge) whose every read
and write gives up after CLIENT_TIMEOUT_S, so a client that stalls, sends half a message or stops reading cannot
hold the ranks."""
from __future__ import annotations

import socket
import struct
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

CLIENT_TIMEOUT_S = 10.0   # one read or write of a client's connection (the key exchange, the request, a reply)


class ServiceListener:
    """127.0.0.1:port (port 0: any free port). accept() gives the next client that proved it holds the key (which
    may be set after binding: the service names its key file by the port)."""

    def __init__(self, port: int, key: bytes = b"", timeout_s: float = CLIENT_TIMEOUT_S):
        self.key, self.timeout_s = key, timeout_s
        self.sock = socket.create_server(("127.0.0.1", port), backlog=16)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def accept(self) -> Connection | None:
        """The next client's connection, or None when it failed the key exchange, went away, or stalled in it."""
        sock, _ = self.sock.accept()
        seconds = int(self.timeout_s)
        timeval = struct.pack("ll", seconds, int((self.timeout_s - seconds) * 1e6))
        # the Connection reads and writes the descriptor directly (os.read/os.write): the kernel's timeouts apply
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self.key)
            answer_challenge(conn, self.key)
        except (OSError, EOFError, AuthenticationError):
            conn.close()
            return None
        return conn

    def close(self) -> None:
        self.sock.close()
