"""A JSON file the engine reads beside a checkpoint (a shard index, an id map): read within a size cap, parsed,
or refused with the file, its role and the problem named (torch-free)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import InputError
from .strict_json import read_capped


def read_json_file(path: Path, role: str, max_bytes: int, error: type[Exception] = InputError,
                   unreadable: type[Exception] | None = None) -> Any:
    """The parsed content of `path`, a `role` file ("shard index", "id map") of at most max_bytes. `error` (a
    sentence naming the file) for a larger file, invalid UTF-8 or JSON, or nesting too deep to parse; `unreadable`
    (default `error`) when the file cannot be read. At most max_bytes + 1 bytes are ever read."""
    try:
        data = read_capped(path, max_bytes)
    except OSError as e:
        raise (unreadable or error)(f"{path}: cannot read the {role} ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than the {max_bytes >> 20} MiB a {role} may have")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # ValueError: bad UTF-8 or JSON
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise error(f"{path}: not a JSON {role} ({reason})") from None
