"""The shape of every request the service takes, checked on rank 0 before any rank acts on it. A request that does
not fit is answered with an InputError naming the field (`settings.bogus`, `prompts[0][3]`, `trace.budget.attention`);
the values' own rules (a temperature's range, an intervention's text) are the typed API's, checked next
(engine.serving.protocol.request_from_json)."""
from __future__ import annotations

import json
import math
from typing import Any

from ..spec.errors import InputError

MAX_REQUEST_BYTES = 16 * 2**20   # one request message; a longer one is dropped unread
MAX_ROWS = 64                    # prompts in one generate request

# A field's kinds: "int", "number", "bool", "str", "null", "object", or ("list", kinds of its items)
Kinds = tuple
INT, NUMBER, BOOL, NULL = ("int",), ("number",), ("bool",), ("null",)
TOKENS = (("list", INT),)
PATHS = (("list", ("str", "int")),)   # module paths or backbone layer numbers

SETTINGS: dict[str, Kinds] = {
    "temperature": NUMBER, "top_k": INT, "top_p": NUMBER, "seed": ("int", "null", ("list", INT)),
    "repetition_penalty": NUMBER, "no_repeat_ngram": INT, "stop_tokens": TOKENS,
    "interventions": (("list", ("str",)),), "cuda_graphs": BOOL, "compiled": BOOL}
DSPARK: dict[str, Kinds] = {"schedule": ("str",), "threshold": NUMBER, "early_stop": BOOL,
                            "confidence_temperature": ("null", ("list", NUMBER))}
BUDGET: dict[str, Kinds] = {"max_tokens": ("int", "null"), "layers": ("null",) + PATHS, "attention": BOOL + PATHS,
                            "top_k_logits": INT, "lens": BOOL}
GENERATE: dict[str, Kinds] = {"op": ("str",), "prompts": (("list", TOKENS),), "max_new_tokens": INT,
                              "settings": ("object", "null"), "dspark": ("object", "null"),
                              "trace": ("object", "null")}
OPS = ("hello", "generate", "shutdown")


def parse_request(data: bytes) -> dict[str, Any]:
    """A request message's JSON (UTF-8, finite numbers, an object), checked against the schema."""
    def no_constant(name: str):
        raise InputError(f"the request holds {name}; numbers must be finite")
    try:
        message = json.loads(data.decode(), parse_constant=no_constant)
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InputError(f"the request is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    check_request(message)
    return message


def check_request(message: Any) -> None:
    """InputError naming the first field of the message that the schema refuses."""
    if not isinstance(message, dict):
        raise InputError(f"a request must be a JSON object, got {_kind_of(message)}")
    op = message.get("op")
    if op not in OPS:
        raise InputError(f"op: expected one of {', '.join(OPS)}, got {_short(op)}")
    if op != "generate":
        _fields(message, {"op": ("str",)}, "", required=("op",))
        return
    _fields(message, GENERATE, "", required=("op", "prompts", "max_new_tokens"))
    if not message["prompts"] or len(message["prompts"]) > MAX_ROWS:
        raise InputError(f"prompts: expected 1 to {MAX_ROWS} prompts, got {len(message['prompts'])}")
    _fields(message.get("settings") or {}, SETTINGS, "settings.")
    if message.get("dspark") is not None:
        _fields(message["dspark"], DSPARK, "dspark.")
    if (trace := message.get("trace")) is not None:
        _fields(trace, {"budget": ("object",), "meta": ("object",)}, "trace.", required=("budget", "meta"))
        _fields(trace["budget"], BUDGET, "trace.budget.")


def _fields(obj: dict, schema: dict[str, Kinds], prefix: str, required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(obj) - set(schema))
    if unknown:
        name = unknown[0] if unknown[0].isidentifier() else repr(unknown[0][:40])
        raise InputError(f"{prefix}{name}: unknown field; the fields are {', '.join(schema)}")
    for name in required:
        if name not in obj:
            raise InputError(f"{prefix}{name}: missing")
    for name, value in obj.items():
        _check(value, schema[name], prefix + name)


def _check(value: Any, kinds: Kinds, where: str) -> None:
    for kind in kinds:
        if isinstance(kind, tuple):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    _check(item, kind[1], f"{where}[{i}]")
                return
        elif _is(value, kind):
            return
    raise InputError(f"{where}: expected {' or '.join(map(_describe, kinds))}, got {_short(value)}")


def _is(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return {"bool": bool, "str": str, "object": dict, "null": type(None)}[kind] is type(value)


def _describe(kind, plural: bool = False) -> str:
    if isinstance(kind, tuple):
        items = " or ".join(_describe(k, plural=True) for k in kind[1])
        return f"lists of {items}" if plural else f"a list of {items}"
    singular, many = {"int": ("an integer", "integers"), "number": ("a number", "numbers"),
                      "bool": ("true or false", "true or false"), "str": ("a string", "strings"),
                      "object": ("an object", "objects"), "null": ("null", "null")}[kind]
    return many if plural else singular


def _kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _short(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"{_kind_of(value)} of {len(value):,} item(s)"
    text = json.dumps(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text):,} characters)"
