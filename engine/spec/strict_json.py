"""Strict, bounded JSON for config files: a size cap, no duplicate keys, bounded nesting and digits (torch-free)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .limits import CONFIG_MAX_BYTES, JSON_MAX_DEPTH, JSON_MAX_INT_DIGITS


def read_capped(path: str | Path, max_bytes: int = CONFIG_MAX_BYTES) -> bytes:
    """At most max_bytes + 1 bytes of a file: enough to tell that a larger one is too large, without reading
    it all (or waiting forever on /dev/zero). OSError is left to the caller."""
    with open(path, "rb") as f:
        return f.read(max_bytes + 1)


def loads(data: str | bytes, *, max_bytes: int = CONFIG_MAX_BYTES) -> Any:
    """Parse JSON text or UTF-8 bytes, raising ConfigError (a sentence) for text over max_bytes, invalid UTF-8 or
    JSON, a key repeated in one object, nesting deeper than JSON_MAX_DEPTH, or an integer literal of more
    than JSON_MAX_INT_DIGITS digits. NaN and Infinity are parsed as floats: whoever reads a number checks it."""
    size = len(data)  # a str of n characters has at least n bytes in UTF-8
    if size > max_bytes:
        raise ConfigError(f"the text is larger than {_size(max_bytes)}, the most a config may have "
                          "(real ones are a few KB)")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")  # a byte-order mark, as some editors write, is not an error
        except UnicodeDecodeError as e:
            raise ConfigError(f"not a text file (not UTF-8 at byte {e.start}); is this really a config.json?") from None
    try:
        value = json.loads(data.removeprefix("\ufeff"), object_pairs_hook=_no_duplicates, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"objects or lists nest too deeply; a config nests at most {JSON_MAX_DEPTH} levels") from None
    depth = nesting_depth(value)
    if depth > JSON_MAX_DEPTH:
        raise ConfigError(f"objects or lists nest {depth} levels deep; a config nests at most {JSON_MAX_DEPTH}")
    return value


def nesting_depth(value: Any) -> int:
    """Levels of objects and lists in a parsed JSON value (0 for a number or string), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def shown(value: Any, limit: int = 60) -> str:
    """A value as JSON for an error message: at most `limit` characters, lone surrogates escaped, never raising."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def shown_key(key: str, limit: int = 60) -> str:
    """A key name for an error message (quoted by the caller): truncated, lone surrogates escaped."""
    return shown(key, limit + 2)[1:-1] if isinstance(key, str) else shown(key, limit)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"key '{shown_key(key)}' appears twice in the same object; which one is meant?")
        out[key] = value
    return out


def _bounded_int(digits: str) -> int:
    n = len(digits.lstrip("-"))
    if n > JSON_MAX_INT_DIGITS:
        raise ConfigError(f"an integer of {n:,} digits (starting {digits[:12]}…); no config value has more than "
                          f"{JSON_MAX_INT_DIGITS}")
    return int(digits)


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB" if n >= 1024 else f"{n} B"
