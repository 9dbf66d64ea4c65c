"""The engine as a service: rank 0 takes requests on a local port, and every rank runs each one in lockstep."""
from __future__ import annotations

from datetime import timedelta
from multiprocessing.connection import Listener

import torch.distributed as dist

from ..dspark.config import DSparkConfig
from ..generation import Engine
from ..parallel.comm import broadcast_json
from ..parallel.world import DistributedError, World
from ..spec.errors import EngineError, InputError
from ..trace import Trace
from .protocol import authkey, budget_from_json, receive, request_from_json, result_to_json, send, step_info_to_json

# Ranks other than 0 wait for the next request inside a broadcast; between requests that may take hours, so
# requests travel over a group of their own whose timeout only bounds a wait for a rank that died silently
# (torchrun ends the others as soon as one rank exits).
IDLE_TIMEOUT = timedelta(days=7)


def serve(engine: Engine, world: World | None, *, port: int, checkpoint: str | None = None,
          on_ready=None) -> None:
    """Serve generation requests until a client asks for shutdown. Rank 0 (or the only process) listens on
    127.0.0.1:port for clients holding the service key (engine.serving.protocol); each request is broadcast to
    every rank, all ranks generate together, and rank 0 streams the tokens back and writes the trace where the
    client asked (both on this host). on_ready(address) is called on rank 0 once it listens."""
    control = None if world is None else dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    main = world is None or world.is_main
    listener = Listener(("127.0.0.1", port), authkey=authkey()) if main else None
    hello = {"args": engine.args.to_dict(), "source": engine.source, "checkpoint": checkpoint,
             "ranks": 1 if world is None else world.size}
    if main and on_ready is not None:
        on_ready(listener.address)
    try:
        while True:
            conn, request = next_request(listener, hello) if main else (None, None)
            if control is not None:
                request = broadcast_json(request, control, "the service's next request")
            if request["op"] == "shutdown":
                break
            run_request(engine, request, Replies(conn), main)
    finally:
        if listener is not None:
            listener.close()


def next_request(listener: Listener, hello: dict):
    """(connection, request) of the next client that asks for work; hello and shutdown requests are answered here."""
    while True:
        try:
            conn = listener.accept()
            request = receive(conn)
        except (OSError, EOFError, ValueError):  # a client that went away, failed the key, or sent no JSON
            continue
        if request.get("op") == "hello":
            Replies(conn).send({"hello": hello})
            conn.close()
            continue
        if request.get("op") in ("generate", "shutdown"):
            if request["op"] == "shutdown":
                Replies(conn).send({"done": None})
            return conn, request
        Replies(conn).send({"error": f"unknown request {request.get('op')!r}; expected hello, generate or shutdown"})
        conn.close()


class Replies:
    """Messages to one client; once it has gone (the app's Stop button closes the connection), they are dropped:
    the ranks still finish the request together."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, message: dict) -> None:
        if self.conn is None:
            return
        try:
            send(self.conn, message)
        except (OSError, EOFError, ValueError):
            self.conn = None

    def token(self, row: int, token: int, info) -> None:
        self.send({"token": [row, token, step_info_to_json(info)]})


def run_request(engine: Engine, request: dict, replies: Replies, main: bool) -> None:
    """One generate request on this rank. A bad request fails alike on every rank (the checks come before any
    collective) and is answered with its message; a failed rank (DistributedError) ends the service."""
    try:
        trace = None
        if request.get("trace"):
            trace = Trace(budget_from_json(request["trace"]["budget"]), meta=request["trace"]["meta"])
        dspark = None
        if request.get("dspark"):
            spec = request["dspark"]
            if spec.get("schedule") == "auto":
                raise InputError("the engine service runs DSpark schedules 'all' and 'threshold'; 'auto' profiles "
                                 "one process")
            temps = spec.get("confidence_temperature")
            dspark = DSparkConfig(spec["schedule"], threshold=spec["threshold"], early_stop=spec["early_stop"],
                                  confidence_temperature=None if temps is None else tuple(temps))
        result = engine.generate(request["prompts"], request_from_json(request, dspark, trace),
                                 on_token=replies.token if main else None)
        if trace is not None and main:
            trace.save(request["trace"]["path"])
    except DistributedError:
        raise
    except EngineError as e:
        replies.send({"error": str(e)})
        return
    replies.send({"done": result_to_json(result), "speculative": dspark is not None})
