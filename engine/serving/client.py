"""RemoteEngine: the Engine interface over a running engine service, so the app can drive an N-rank engine."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

from ..checkpoint.store import id_map_beside
from ..generation import Engine, GenerationResult, StepInfo
from ..generation.results import OnToken
from ..request import GenerationRequest
from ..spec.config import config_from_dict
from ..spec.errors import EngineError, InputError
from ..text.byte_fallback import ByteFallbackTokenizer
from ..text.tokenizer import load_tokenizer
from ..trace import Trace
from .key import client_key
from .protocol import DEFAULT_PORT, TRACE_NAME, budget_to_json, receive, result_from_json, send, settings_to_json

ADDRESS_ENV = "V41VIZ_ENGINE"   # host:port of a running service; the app attaches to it when this is set


class ServiceGone(EngineError):
    """The engine service ended, or its connection broke, during a request: the app goes on with a local engine."""


class RemoteEngine(Engine):
    """Engine.generate / generate_text / encode against a service started with `python -m engine.serving`
    (under torchrun: an N-rank engine) on this host. The tokenizer runs here; the weights live in the service,
    so `model` is None. A trace passed to generate is filled in place from the trace rank 0 recorded."""

    def __init__(self, address: str = f"127.0.0.1:{DEFAULT_PORT}"):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InputError(f"engine service address must be host:port, got {address!r}")
        self.address = (host, int(port))
        self.gone: str | None = None   # why the service is gone, once a request found it so
        hello = self.request({"op": "hello"})["hello"]
        raw = dict(hello["args"])
        args = config_from_dict(raw, raw.pop("name", "") or "")
        tokenizer = load_tokenizer()
        if hello["checkpoint"]:  # a reduced-vocabulary checkpoint maps model ids to tokenizer ids, as Engine.load does
            id_map = id_map_beside(hello["checkpoint"], tokenizer, args.vocab_size)
            tokenizer = tokenizer if id_map is None else ByteFallbackTokenizer(id_map)
        self.args, self.model, self.tokenizer = args, None, tokenizer
        self.ranks = hello["ranks"]
        self.source = f"{hello['source']} · engine service {address}"

    def request(self, message: dict, on_message=None, *, trace: bool = False) -> dict:
        """Send one request on a fresh connection; pass streamed messages to on_message; return the last one
        (with trace: and the trace's bytes that follow it, as "trace_bytes"). InputError for a refused request;
        ServiceGone when the service is not there or ends before it answers."""
        where = f"{self.address[0]}:{self.address[1]}"
        try:
            key = client_key(self.address[1])
        except InputError as e:   # a service removes its key file when it ends: none there, no service
            self.gone = f"no engine service at {where} ({e})"
            raise ServiceGone(self.gone) from None
        try:
            conn = Client(self.address, authkey=key)
        except AuthenticationError:
            raise InputError(f"the engine service at {where} refused this client's key (the key file of its "
                             "start, or ENGINE_SERVICE_KEY)") from None
        except OSError as e:
            self.gone = f"no engine service at {where} ({e})"
            raise ServiceGone(f"{self.gone}; start one with `torchrun --nproc-per-node N -m engine.serving ...`") \
                from None
        try:
            with conn:
                send(conn, message)
                while True:
                    reply = receive(conn)
                    if reply.get("service_ended"):
                        self.gone = reply["error"]
                        raise ServiceGone(reply["error"])
                    if "error" in reply:
                        raise InputError(reply["error"])
                    if "token" not in reply:
                        if trace and reply.get("trace"):
                            reply["trace_bytes"] = conn.recv_bytes()
                        return reply
                    if on_message is not None:
                        on_message(reply)
        except (OSError, EOFError) as e:
            self.gone = f"the engine service at {where} closed the connection mid-request ({type(e).__name__})"
            raise ServiceGone(f"{self.gone}: it has ended or was stopped") from None

    def generate(self, prompts: Sequence[Sequence[int]], request: GenerationRequest, *,
                 on_token: OnToken | None = None, token_text: Callable[[int], str] | None = None) -> GenerationResult:
        """Engine.generate in the service. Tokens stream to on_token as they are made; the service labels the trace
        with its own tokenizer (token_text is not used)."""
        dspark, trace = request.dspark, request.trace
        message = {"op": "generate", "prompts": [[int(t) for t in p] for p in prompts],
                   "max_new_tokens": request.max_new_tokens, "settings": settings_to_json(request), "dspark": None,
                   "trace": None}
        if dspark is not None:
            message["dspark"] = {"schedule": dspark.schedule, "threshold": dspark.threshold,
                                 "early_stop": dspark.early_stop,
                                 "confidence_temperature": dspark.confidence_temperature}
        if trace is not None:
            message["trace"] = {"budget": budget_to_json(trace.budget), "meta": trace.meta}

        def on_message(reply: dict) -> None:
            if on_token is not None:
                row, token, info = reply["token"]
                on_token(row, token, StepInfo(**info))

        done = self.request(message, on_message, trace=trace is not None)
        steps = []
        if trace is not None:
            recorded = Trace.from_bytes(TRACE_NAME, done["trace_bytes"])
            vars(trace).update(vars(recorded))   # the caller's object now holds what rank 0 recorded
            steps = list(trace.dspark_steps)
        return result_from_json(done["done"], done["speculative"], steps)

    def shutdown(self) -> None:
        """Ask the service to stop: every rank leaves its loop and the launch ends."""
        self.request({"op": "shutdown"})
