"""cast(): a dtype conversion that costs nothing when there is nothing to convert."""
from __future__ import annotations

import torch


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype`, without a call when it already is: `t.to(t.dtype)` returns t but still dispatches an op, and
    at decode sizes each op costs microseconds."""
    return t if t.dtype == dtype else t.to(dtype)
