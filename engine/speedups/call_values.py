"""Per-call values every layer of a forward would otherwise recompute (cached in the call's ForwardContext.memo)."""
from __future__ import annotations

import torch

from ..model.attention import all_visible
from ..model.context import ForwardContext
from .sync_free import sync_free_active


def call_width(ctx: ForwardContext, ratio: int) -> int:
    """ctx.width(ratio): compressed rows the call's widest row can see, from the host's positions, once per call
    and ratio (under sync_free(), ctx.width itself: a CUDA-graph body's context gives the capacity)."""
    if sync_free_active():
        return ctx.width(ratio)
    starts = ctx.cached("starts", ctx.start.tolist)
    return ctx.cached(("width", ratio), lambda: max((s + ctx.n_tokens) // ratio for s in starts))


def call_visible(ctx: ForwardContext, ratio: int) -> torch.Tensor:
    """ctx.visible(ratio) [B, S], once per call and ratio."""
    return ctx.cached(("visible", ratio), lambda: ctx.visible(ratio))


def every_visible_row(ctx: ForwardContext, ratio: int, width: int) -> torch.Tensor:
    """The index list naming every compressed row each query may use (engine.model.attention.all_visible),
    [B, S, width], once per call, ratio and width."""
    return ctx.cached(("all_visible", ratio, width), lambda: all_visible(call_visible(ctx, ratio), width))


def own_positions(ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of this call's tokens by absolute position in a per-row cache tensor: (rows [B, 1], positions [B, S])."""
    return ctx.cached("own_positions", lambda: (ctx.rows_dev.unsqueeze(1), ctx.positions))


def ring_slots(ctx: ForwardContext, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of this call's tokens in a window ring: (rows [B, 1], position % slots [B, S])."""
    return ctx.cached(("ring_slots", slots), lambda: (ctx.rows_dev.unsqueeze(1), ctx.positions % slots))


def call_rows(ctx: ForwardContext, cache_tensor: torch.Tensor) -> torch.Tensor:
    """The call's rows of a [rows, …] cache tensor: a view for one row, a gather for several (and under
    sync_free(), where a CUDA-graph body keeps the row on the device)."""
    if ctx.rows.numel() == 1 and not sync_free_active():
        row = ctx.cached("row", lambda: int(ctx.rows[0]))
        return cache_tensor[row:row + 1]
    return cache_tensor[ctx.rows_dev]
