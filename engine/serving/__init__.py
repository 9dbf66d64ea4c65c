"""The engine as a local service (one process, or N ranks under torchrun) and RemoteEngine, the app's way to attach."""
from .client import ADDRESS_ENV, RemoteEngine
from .service import serve

__all__ = ["ADDRESS_ENV", "RemoteEngine", "serve"]
