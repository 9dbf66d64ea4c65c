"""Speed transforms applied to a built reference model (engine.model stays the readable spec), as gpt-fast does."""
from .apply import active_backend, apply_kernels, apply_speedups, prepare_for_inference, remove_kernels
from .sync_free import sync_free

__all__ = ["active_backend", "apply_kernels", "apply_speedups", "prepare_for_inference", "remove_kernels",
           "sync_free"]
