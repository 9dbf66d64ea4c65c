"""DerivedWeights: tensors made from parameters (fp32 copies, concatenations), rebuilt when a source changes."""
from __future__ import annotations

import operator
import weakref
from collections.abc import Callable

import torch


class DerivedWeights:
    """A module's cache of tensors computed from its parameters, each rebuilt whenever any of its sources was
    replaced (another tensor object or storage) or modified in place (its version counter moved), so that a
    fast path can read e.g. one fused weight instead of three without going stale after load_state_dict, an
    optimizer step or `model.to(...)`. Not part of the state dict: the sources stay the parameters."""

    def __init__(self):
        # name → (weak references to the sources, their (storage, version) stamps, the derived value)
        self._entries: dict[str, tuple[list[weakref.ref], list[tuple[int, int]], object]] = {}

    def has(self, name: str) -> bool:
        """Whether a value named `name` was made (current or not)."""
        return name in self._entries

    def get(self, name: str, sources: tuple[torch.Tensor, ...], build: Callable[[], object]):
        """The value `build()` made from `sources`, rebuilt only when one of them changed. This runs on every
        decode call, for up to a few dozen sources: hence the plain list comparisons."""
        entry = self._entries.get(name)
        if entry is not None and torch.compiler.is_compiling():
            return entry[2]   # compiled code holds its weights as traced, like a captured CUDA graph
        stamps = [(t.data_ptr(), t._version) for t in sources]
        if entry is not None and entry[1] == stamps and all(map(operator.is_, [r() for r in entry[0]], sources)):
            return entry[2]
        with torch.no_grad():
            value = build()
        self._entries[name] = ([weakref.ref(t) for t in sources], stamps, value)
        return value


def derived(module) -> DerivedWeights:
    """`module`'s DerivedWeights (made on first use; a plain attribute, so no buffer or parameter)."""
    cache = module.__dict__.get("_derived")
    if cache is None:
        cache = module.__dict__["_derived"] = DerivedWeights()
    return cache
