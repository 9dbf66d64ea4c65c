"""LastCall: the last admitted record call, by which the recorder knows a later call of the same tokens."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .slots import CallTokens


class LastCall(NamedTuple):
    """The last admitted record call: its rows and positions tensors, the slot epoch it was admitted under, host views
    of the tensors with their bytes then (a later call with the same tensors and bytes is of the same tokens), and
    its admitted tokens."""
    positions: object            # the call's positions tensor [B, S] (compared by identity)
    rows: object                 # its rows tensor [B], or None
    epoch: int                   # TokenSlots.epoch when the call was admitted (a freed slot changes it)
    positions_view: np.ndarray   # a host view of positions' memory
    positions_bytes: bytes       # positions_view's bytes at admission
    rows_view: np.ndarray | None     # a host view of rows' memory, or None
    rows_bytes: bytes | None         # rows_view's bytes at admission, or None
    tokens: CallTokens           # the call's tokens as admitted under the budget

    def same_tokens(self, rows, positions, epoch: int) -> bool:
        """Whether a call with these tensors is of the same tokens: the same tensors, holding the same values
        (read through the views), and no slot freed since."""
        return self.positions is positions and self.rows is rows and self.epoch == epoch and \
            self.positions_view.tobytes() == self.positions_bytes and \
            (self.rows_view is None or self.rows_view.tobytes() == self.rows_bytes)
