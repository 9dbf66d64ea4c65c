"""One JSON value checked against a ModelArgs field's type: exact 64-bit integers, finite numbers, short names."""
from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError
from .limits import STR_MAX_CHARS
from .strict_json import shown

INT64_MAX = 2**63 - 1
KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
         "tuple[int, ...]": "a list of integers", "float | None": "a number or null"}


def coerce(key: str, kind: str, value: Any) -> Any:
    """The field value for JSON `value` (lists become tuples), or ConfigError naming the key and the problem."""
    if kind == "int":
        return _integer(key, value)
    if kind == "float | None" and value is None:
        return None
    if kind in ("float", "float | None"):
        return _number(key, kind, value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _wrong_type(key, kind, value)
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _wrong_type(key, kind, value)
        if len(value) > STR_MAX_CHARS:
            raise ConfigError(f"'{key}' is a string of {len(value):,} characters; it names a setting and has at "
                              f"most {STR_MAX_CHARS}")
        return value
    if kind == "tuple[int, ...]":
        if not isinstance(value, list):
            raise _wrong_type(key, kind, value)
        return tuple(_integer(f"{key}[{i}]", v) for i, v in enumerate(value))
    raise AssertionError(f"unhandled field type {kind} for {key}")


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(key, "int", value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"'{key}' must be a finite integer, got {shown(value)}")
        if not value.is_integer():
            raise _wrong_type(key, "int", value)
        value = int(value)
    if not -INT64_MAX <= value <= INT64_MAX:
        raise ConfigError(f"'{key}' is {value:.3e}, beyond the 64-bit integer range (and any model size)")
    return value


def _number(key: str, kind: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(key, kind, value)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"'{key}' must be a finite number, got {shown(value)}")
    return number


def _wrong_type(key: str, kind: str, value: Any) -> ConfigError:
    return ConfigError(f"'{key}' must be {KINDS[kind]}, got {shown(value)}")
