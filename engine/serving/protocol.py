"""The engine service's messages: JSON over an authenticated local connection (multiprocessing.connection), never pickled."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from typing import Any

from ..generation import GenerationResult, SpeculativeResult, StepInfo
from ..trace import TraceBudget

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
