"""The engine as a local service (one process, or N ranks under torchrun) and RemoteEngine, the app's way to attach.

The service and its client load torch, so they are imported on first use (PEP 562): the request schema, the key
and the listener (engine.serving.schema, .key, .listener) stay torch-free for `python -m engine limits`."""
from importlib import import_module

_HOMES = {"ADDRESS_ENV": "client", "RemoteEngine": "client", "ServiceGone": "client", "serve": "service"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_HOMES[name]}", __name__), name)
