"""PendingLogits: generated tokens' logits held in one block until their records are read, then resolved together."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .records import TokenRecord

if TYPE_CHECKING:  # the logits are the model's: named for annotations only
    import torch

# the block's size: 16 MiB of fp32 logits (1,298 rows of a 3,229-id vocabulary, 32 of 129,280)
PENDING_BYTES = 16 * 2**20


class PendingLogits:
    """A decode step hands its token's logits [V] to the trace, which keeps only its top-k and log-probability.
    Working those out per step costs a log-softmax, a top-k and a few small ops between two forwards, where each op
    pays for the caches the forward has filled; here a step only copies its row into a preallocated fp32 block
    [rows, V] (one op), and the rows are resolved together (engine.trace.token_logits.set_predicted) when the
    block is full or a token record is read. The block holds PENDING_BYTES, so its memory is bounded whatever the
    run's length; its pages are touched only as rows are written."""

    def __init__(self) -> None:
        self.block = None              # torch.Tensor [rows, V] fp32 on the logits' device, made at first use
        self.records: list[TokenRecord] = []

    def add(self, record: TokenRecord, logits: torch.Tensor, k: int) -> None:
        """Keep logits [V] (or [1, V]) for record; its top-k (k) and log-probability are set when resolved."""
        row = logits.detach().reshape(-1)
        block = self.block
        if block is None or block.size(1) != row.numel() or block.device != row.device:
            self.resolve(k)
            # torch loads only when this runs, not with the trace package: a saved trace opens without it
            import torch
            rows = max(1, PENDING_BYTES // (4 * row.numel()))
            block = self.block = torch.empty(rows, row.numel(), dtype=torch.float32, device=row.device)
        elif len(self.records) == len(block):
            self.resolve(k, keep_block=True)
        block[len(self.records)].copy_(row)      # (any float dtype, read as fp32)
        self.records.append(record)

    def resolve(self, k: int, keep_block: bool = False) -> None:
        """Set every held record's top-k and log-probability; the block is let go unless keep_block (a full one,
        reused by the run that filled it: a read comes after a run, or between runs)."""
        records, block, self.records = self.records, self.block, []
        if not keep_block:
            self.block = None
        if not records:
            return
        # token_logits loads torch: only when logits are resolved, not with the trace package
        from .token_logits import set_predicted
        set_predicted(records, block[: len(records)], k)
