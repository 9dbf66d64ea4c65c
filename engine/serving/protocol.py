"""The engine service's messages: JSON on an authenticated local connection (multiprocessing.connection), no pickle;
a trace comes back as safetensors bytes in a frame of its own, so no client ever names a path on the service's side."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, fields
from typing import Any

from ..dspark.config import DSparkConfig
from ..generation import GenerationResult, SpeculativeResult, StepInfo
from ..request import GenerationRequest
from ..spec.errors import InputError
from ..trace import Trace, TraceBudget
from ..trace.safetensors_file import write_safetensors
from .schema import parse_request

DEFAULT_PORT = 8765
TRACE_NAME = "service.safetensors"   # the name a returned trace is read under (its format and its messages)


def send(conn, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def receive(conn) -> dict[str, Any]:
    """A reply from the service (the client trusts its own service: no size bound here)."""
    return json.loads(conn.recv_bytes().decode())


def receive_request(conn, max_bytes: int) -> dict[str, Any]:
    """A client's request, at most max_bytes (OSError beyond: the connection is then closed unread), checked
    against the schema (InputError naming the field)."""
    return parse_request(conn.recv_bytes(max_bytes))


def trace_bytes(trace: Trace) -> bytes:
    """The trace as the safetensors bytes Trace.from_bytes(TRACE_NAME, ...) reads back."""
    return write_safetensors(*trace.to_tables())


def budget_to_json(budget: TraceBudget) -> dict[str, Any]:
    def plain(v):
        return sorted(v) if isinstance(v, frozenset) else v
    return {k: plain(v) for k, v in asdict(budget).items()}


def budget_from_json(raw: dict[str, Any]) -> TraceBudget:
    raw = {"attention": False, **raw}
    if raw.get("layers") is not None:
        raw["layers"] = frozenset(raw["layers"])
    if not isinstance(raw.get("attention"), bool):
        raw["attention"] = frozenset(raw["attention"])
    return TraceBudget(**raw)


def step_info_to_json(info: StepInfo) -> dict[str, Any]:
    return asdict(info)


def result_to_json(result: GenerationResult) -> dict[str, Any]:
    """The result's plain fields (DSpark steps travel in the trace, which records them)."""
    return {f.name: getattr(result, f.name) for f in fields(result) if f.name != "steps"}


def result_from_json(raw: dict[str, Any], speculative: bool, steps: list) -> GenerationResult:
    if speculative:
        return SpeculativeResult(**raw, steps=steps)
    return GenerationResult(**raw)


def settings_to_json(request: GenerationRequest) -> dict[str, Any]:
    """A request's settings as the generate message carries them (its DSpark config and trace travel apart)."""
    sampling = request.sampling
    seed = list(sampling.seed) if isinstance(sampling.seed, tuple) else sampling.seed
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p, "seed": seed,
            "repetition_penalty": sampling.repetition_penalty, "no_repeat_ngram": sampling.no_repeat_ngram,
            "stop_tokens": list(request.stop_tokens), "interventions": [iv.text for iv in request.interventions],
            "cuda_graphs": request.cuda_graphs, "compiled": request.compiled}


def request_from_json(message: dict[str, Any]) -> GenerationRequest:
    """The GenerationRequest a generate message (checked by engine.serving.schema) asks for, with its DSpark config
    and a fresh Trace of its budget; settings left out take their defaults. InputError, naming the part, for a
    value the typed API refuses."""
    trace = None
    if message.get("trace"):
        with _part("trace.budget"):
            trace = Trace(budget_from_json(message["trace"]["budget"]), meta=message["trace"]["meta"])
    dspark = None
    if spec := message.get("dspark"):
        with _part("dspark"):
            if spec.get("schedule") == "auto":
                raise InputError("the engine service runs DSpark schedules 'all' and 'threshold'; 'auto' profiles "
                                 "one process")
            temps = spec.get("confidence_temperature")
            dspark = DSparkConfig(**{**spec, "confidence_temperature": None if temps is None else tuple(temps)})
    with _part("settings"):
        return GenerationRequest.of(message["max_new_tokens"], dspark=dspark, trace=trace,
                                    **(message.get("settings") or {}))


@contextmanager
def _part(where: str):
    """An InputError raised within names the part of the request it is about."""
    try:
        yield
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
