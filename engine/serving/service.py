"""The engine as a service: rank 0 takes requests on a local port, and every rank runs each one in lockstep."""
from __future__ import annotations

import contextlib
import signal
import sys
from datetime import timedelta

import torch.distributed as dist

from ..generation import Engine
from ..generation.results import check_prompts
from ..parallel.comm import broadcast_json
from ..parallel.health import answer_rank_zero, silent_ranks
from ..parallel.world import DistributedError, World
from ..spec.errors import EngineError, InputError
from .key import remove_key, service_key
from .listener import ServiceListener
from .protocol import receive_request, request_from_json, result_to_json, send, step_info_to_json, trace_bytes
from .schema import MAX_REQUEST_BYTES

# Ranks other than 0 wait for the next request inside a broadcast; between requests that may take hours, so
# requests travel over a group of their own whose timeout only bounds a wait for a rank that died silently
# (torchrun ends the others as soon as one rank exits).
IDLE_TIMEOUT = timedelta(days=7)


def serve(engine: Engine, world: World | None, *, port: int, checkpoint: str | None = None,
          on_ready=None) -> None:
    """Serve generation requests until a client asks for shutdown. Rank 0 (or the only process) listens on
    127.0.0.1:port (0: a free port) for clients holding this start's key (engine.serving.key), checks each request
    against the schema and the typed API before any other rank sees it, broadcasts it to every rank, and all ranks
    generate together; rank 0 streams the tokens back, then the trace's bytes. on_ready(address, key_file) is
    called on rank 0 once it listens."""
    control = None if world is None else dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    health = None if world is None else dist.new_group(backend="gloo", timeout=timedelta(seconds=world.timeout_s))
    main = world is None or world.is_main
    listener, key, key_path = None, None, None
    hello = {"args": engine.args.to_dict(), "source": engine.source, "checkpoint": checkpoint,
             "ranks": 1 if world is None else world.size}
    try:
        if main:
            listener = ServiceListener(port)
            key, key_path = service_key(listener.address[1])   # the key file is named by the port: bound first
            listener.key = key
            if on_ready is not None:
                on_ready(listener.address, key_path)
        while True:
            conn, request = next_request(listener, hello, engine) if main else (None, None)
            replies = Replies(conn)
            try:
                if control is not None:
                    request = broadcast_json(request, control, "the service's next request")
                if request["op"] == "shutdown":
                    break
                run_request(engine, request, replies, main)
            except DistributedError as error:
                raise service_ended(error, world, health, replies) from None
            finally:
                replies.close()
    finally:
        if listener is not None:
            listener.close()
        if key_path is not None:
            remove_key(key_path, key)


def next_request(listener: ServiceListener, hello: dict, engine: Engine):
    """(connection, request) of the next client whose request passes every check; hello is answered here, a
    request that fails a check is answered with the error naming its field, and a connection that is too long,
    truncated, stalled or gone is dropped. Nothing here reaches the other ranks."""
    while True:
        conn = listener.accept()
        if conn is None:
            continue
        replies = Replies(conn)
        try:
            request = receive_request(conn, MAX_REQUEST_BYTES)
            if request["op"] == "generate":
                request_from_json(request)
                try:
                    check_prompts(request["prompts"], engine.args.vocab_size, engine.args.max_seq_len)
                except InputError as e:
                    raise InputError(f"prompts: {e}") from None
            elif request["op"] == "hello":
                replies.send({"hello": hello})
                replies.close()
                continue
            else:
                replies.send({"done": None})
            return conn, request
        except InputError as e:
            replies.send({"error": str(e)})
        except (OSError, EOFError) as e:   # longer than MAX_REQUEST_BYTES, cut short, stalled, or gone
            print(f"engine service: dropped a client ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        replies.close()


class Replies:
    """Messages to one client; once it has gone (the app's Stop button closes the connection) or stops reading
    (a write waits at most CLIENT_TIMEOUT_S), they are dropped: the ranks still finish the request together."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, message: dict) -> None:
        self._write(send, message)

    def send_bytes(self, data: bytes) -> None:
        self._write(lambda conn, d: conn.send_bytes(d), data)

    def _write(self, write, payload) -> None:
        if self.conn is None:
            return
        try:
            write(self.conn, payload)
        except (OSError, EOFError, ValueError):
            self.close()

    def token(self, row: int, token: int, info) -> None:
        self.send({"token": [row, token, step_info_to_json(info)]})

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run_request(engine: Engine, request: dict, replies: Replies, main: bool) -> None:
    """One generate request (already checked on rank 0) on this rank. An error the engine raises alike on every
    rank is answered with its message; a failed rank (DistributedError) ends the service (service_ended)."""
    try:
        generation = request_from_json(request)
        result = engine.generate(request["prompts"], generation, on_token=replies.token if main else None)
    except DistributedError:
        raise
    except EngineError as e:
        replies.send({"error": str(e)})
        return
    trace = generation.trace
    replies.send({"done": result_to_json(result), "speculative": generation.dspark is not None,
                  "trace": trace is not None})
    if trace is not None and main:
        replies.send_bytes(trace_bytes(trace))


def service_ended(error: DistributedError, world: World, health, replies: Replies) -> DistributedError:
    """A rank failed during a request: rank 0 names the ranks that are gone or stopped answering
    (engine.parallel.health), tells the client, and ends with that message; the other ranks give it their sign of
    life and end with their own. Within the process group's timeout (a frozen rank) or at once (a rank that ended);
    then torchrun ends what is left."""
    if not world.is_main:
        answer_rank_zero(health, world.timeout_s)
        return error
    with contextlib.suppress(ValueError):   # the launcher's SIGTERM, now on its way: this rank is ending already
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    noticed = str(error).split(". Another rank")[0]
    message = "the engine service has ended: " + "; ".join(silent_ranks(world, health, world.timeout_s) +
                                                          [f"noticed by {noticed}"])
    replies.send({"error": message, "service_ended": True})
    return DistributedError(message)
