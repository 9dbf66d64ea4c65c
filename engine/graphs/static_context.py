"""StaticContext, StaticDraftContext: the forward contexts of a CUDA-graph body (static shapes, no host reads)."""
from __future__ import annotations

import torch

from ..model.context import ForwardContext
from ..model.draft import DraftContext


class StaticContext(ForwardContext):
    """A ForwardContext whose rows and start live on the model's device and whose shapes depend on no value, so
    that the same launches replay for any positions: widths are the cache's full capacity (rows past a query's
    `visible` are masked downstream), a compressor returns the most groups any row can complete in the call's
    tokens (rows completing fewer mark the rest invalid; their writes go to the scratch row), and the trace gets
    the device tensors as they are (the graph's trace buffers ignore them; the host supplies its own). The speed
    paths read no value back either: the bodies run under engine.speedups.sync_free."""

    def width(self, ratio: int) -> int:
        return self.cache.max_seq_len // ratio + 1

    def groups_out(self, n_done: torch.Tensor, ratio: int) -> int:
        return -(-self.n_tokens // ratio)

    def hands_lens_unread(self) -> bool:
        return False   # the trace buffers take only read-out layers

    def trace_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows, self.positions


class StaticDraftContext(DraftContext):
    """A DraftContext for the CUDA-graph draft body: the trace gets the device tensors as they are."""

    def trace_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows, self.positions
