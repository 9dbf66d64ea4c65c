"""The rows sparse attention reads, in one index_select: the same rows as the reference's advanced indexing."""
from __future__ import annotations

import torch


def selected_rows(kv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """engine.model.sparse_attn.gather_rows: the rows of kv [B, N, D] that idx [B, s, K] lists → [B, s, K, D]
    (−1 reads row 0), as one index_select over the batch's rows laid end to end. On the CPU advanced indexing with
    a batch index walks the index tensors element by element; index_select copies whole rows (several times
    faster in fp32, more in bf16, at a prefill's sizes)."""
    B, N, D = kv.shape
    flat = idx.clamp_min(0)
    if B > 1:
        flat = flat + torch.arange(B, device=idx.device).view(-1, 1, 1) * N    # row b's entries → b·N + i
    return kv.reshape(B * N, D).index_select(0, flat.reshape(-1)).view(*idx.shape, D)
