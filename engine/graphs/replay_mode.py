"""What GraphedDecoder and GraphedDrafter settle alike at construction: the scratch row and whether to capture."""
from __future__ import annotations

from ..spec.errors import InputError


def scratch_row_for(scratch_row: int | None, n_rows: int, what: str) -> int:
    """The row padding rows use (default the last of `n_rows`), checked to lie inside `what`."""
    row = n_rows - 1 if scratch_row is None else int(scratch_row)
    if not 0 <= row < n_rows:
        raise InputError(f"scratch_row {row} outside {what} rows 0..{n_rows - 1}")
    return row


def capture_for(model, capture: bool | None) -> bool:
    """Capture CUDA graphs (default: when the model is on CUDA); elsewhere the static body replays eagerly."""
    cuda = model.device.type == "cuda"
    wanted = cuda if capture is None else bool(capture)
    if wanted and not cuda:
        raise InputError(f"capture=True needs the model on a CUDA device, not {model.device}; "
                         "capture=False replays the same static body eagerly")
    return wanted
