"""Config fields that are also command-line options: the help text rides on the dataclass field."""
from __future__ import annotations

from dataclasses import field


def option(default, help: str, flag: str | None = None):
    """A dataclass field offered on the command line as `--name-with-dashes` (or `flag`), typed by its
    default, with `help` (the default is appended). Fields declared without it stay off the command line."""
    return field(default=default, metadata={"help": help, **({"flag": flag} if flag else {})})
