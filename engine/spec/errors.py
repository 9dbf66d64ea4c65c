"""The engine's error classes: bad input it refuses, each message naming the key, file or value and the problem.

Every error a user can cause derives from EngineError, so the CLI and the app catch exactly these and let
anything else surface as the bug it is. InputError and MissingFileError also derive from the built-in
ValueError and FileNotFoundError they replace, so callers that caught those keep working."""


class EngineError(Exception):
    """Base of every error the engine raises for bad input (never for its own bugs)."""


class InputError(EngineError, ValueError):
    """An argument, setting, prompt or file content the engine cannot use."""


class MissingFileError(EngineError, FileNotFoundError):
    """A file or directory the user named (or the engine needs) is not there."""


class ConfigError(InputError):
    """A config.json that cannot describe a model; the message names the key and the problem."""
