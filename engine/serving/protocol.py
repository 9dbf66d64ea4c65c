"""The engine service's messages: JSON on an authenticated local connection (multiprocessing.connection), no pickle."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from typing import Any

from ..dspark.config import DSparkConfig
from ..generation import GenerationResult, SpeculativeResult, StepInfo
from ..request import GenerationRequest
from ..spec.errors import InputError
from ..trace import Trace, TraceBudget

# the keys of a generate message's "settings": GenerationRequest.of's keywords that travel as JSON values
SETTINGS = ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "no_repeat_ngram", "stop_tokens",
            "interventions", "cuda_graphs", "compiled")
KEY_ENV = "ENGINE_SERVICE_KEY"   # shared secret of the service and its clients (both on this host)
DEFAULT_KEY = "v41viz-local"
DEFAULT_PORT = 8765


def authkey() -> bytes:
    return os.environ.get(KEY_ENV, DEFAULT_KEY).encode()


def send(conn, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def receive(conn) -> dict[str, Any]:
    return json.loads(conn.recv_bytes().decode())


def budget_to_json(budget: TraceBudget) -> dict[str, Any]:
    def plain(v):
        return sorted(v) if isinstance(v, frozenset) else v
    return {k: plain(v) for k, v in asdict(budget).items()}


def budget_from_json(raw: dict[str, Any]) -> TraceBudget:
    raw = dict(raw)
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


def request_from_json(message: dict[str, Any], dspark: DSparkConfig | None, trace: Trace | None) -> GenerationRequest:
    """The GenerationRequest a generate message asks for (settings left out take their defaults); InputError for
    a setting the request has no field for, or a value its checks refuse."""
    settings = message.get("settings") or {}
    if not isinstance(settings, dict):
        raise InputError(f"a generate request's settings must be an object, got {type(settings).__name__}")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise InputError(f"unknown generate setting(s) {', '.join(map(repr, unknown))}; the settings are "
                         f"{', '.join(SETTINGS)}")
    return GenerationRequest.of(message.get("max_new_tokens"), dspark=dspark, trace=trace, **settings)
