"""The indexer's stable top-k without a sort: a k-th-value threshold, ties to the lower index, picks in order."""
from __future__ import annotations

import torch

from ..model.indexer import candidate_block_scores, select_candidate_blocks, stable_topk


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor | None:
    """bool mask [..., W] of the k entries engine.model.indexer.stable_topk picks along the last dim: every entry
    above the k-th largest value, then the lowest-index entries equal to it (−inf ties included) until k are
    taken. A top-k and a running count cost O(W) a row where the stable sort costs O(W log W) (the sort was a
    sixth of a 512-token prefill). None where a row holds NaN (torch.topk and the sort order NaN differently):
    the caller sorts then."""
    if bool(scores.isnan().any()):
        return None
    kth = scores.topk(k, dim=-1).values[..., -1:]                           # [..., 1]
    above = scores > kth
    tied = scores == kth
    room = k - above.sum(-1, keepdim=True)                                  # [..., 1] ties still to take
    return above | (tied & (tied.cumsum(-1, dtype=torch.int32) <= room))   # int32: half int64's bytes


def ascending_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """stable_topk(scores, k).sort(-1).values: the k picks of each row [..., W] → their indices [..., k],
    ascending (nonzero lists a row's picks in order)."""
    mask = topk_mask(scores, k)
    if mask is None:
        return stable_topk(scores, k).sort(-1).values
    return mask.nonzero()[:, -1].view(*scores.shape[:-1], k)


def candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, top_blocks: int, block: int) -> torch.Tensor:
    """engine.model.indexer.select_candidate_blocks with its top-k as a mask (topk_mask): scores [B, S, W],
    visible [B, S] → bool [B, S, W], the same positions."""
    width = scores.size(-1)
    block_scores = candidate_block_scores(scores, visible, block)           # [B, S, n_blocks]
    n_blocks = block_scores.size(-1)
    top = topk_mask(block_scores, min(top_blocks, n_blocks))
    if top is None:
        return select_candidate_blocks(scores, visible, top_blocks, block)
    keep = top & (block_scores > float("-inf"))                             # fewer reachable blocks: drop the rest
    return keep.unsqueeze(-1).expand(*keep.shape, block).flatten(-2)[..., :width]
