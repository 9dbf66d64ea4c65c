"""Sparse attention for a few queries read straight from the window ring (masked) plus the listed compressed rows."""
from __future__ import annotations

import functools

import torch

from ..model.norm import upcast
from .casts import cast
from .row_invariant import KERNEL_ROWS
from .sync_free import sync_free_active


@functools.lru_cache(maxsize=64)
def head_means(heads: int, n: int, slots: int, dtype: torch.dtype) -> torch.Tensor:
    """[heads·n, 3] on the CPU: p [B, S, heads, n] viewed as [B, S, heads·n] times this is the head-averaged
    probability mass on the window (a query's first `slots` keys), on the compressed rows (those after) and on
    the sink (the last), [B, S, 3]. A plain tensor even when first asked for under inference mode."""
    with torch.inference_mode(False):
        part = torch.zeros(n, 3, dtype=dtype)
        part[:slots, 0] = 1
        part[slots:-1, 1] = 1
        part[-1, 2] = 1
        return (part / heads).repeat(heads, 1)


def ring_hidden(ctx, slots: int, window: int) -> torch.Tensor:
    """[B, S, 1, slots] True where a ring slot is not in the query's window, once this call's tokens are written.
    Slot σ then holds the newest position ≤ the call's last that is ≡ σ (mod slots); a query at t sees it when
    t − window < that position ≤ t (and it is ≥ 0). Cached for the call: every layer's ring has the same shape."""
    def make() -> torch.Tensor:
        t = ctx.positions                                                    # [B, S]
        last = t[:, -1:]                                                     # [B, 1]
        held = (last - (last - torch.arange(slots, device=t.device)) % slots).view(-1, 1, 1, slots)
        t = t.view(*t.shape, 1, 1)                                           # [B, S, 1, 1]
        return (held > t) | (held <= t - window) | (held < 0)
    return ctx.cached(("ring_hidden", slots, window), make)


def window_attention(q: torch.Tensor, ring: torch.Tensor, hidden: torch.Tensor, sink: torch.Tensor,
                     compressed: torch.Tensor | None = None, topk: torch.Tensor | None = None, *,
                     return_mass: bool = False):
    """engine.model.sparse_attn.sparse_attn over the keys a query may read, arranged for few queries:
    q [B, S, H, D] already times the softmax scale; ring [B, slots, D] this call's rows of the window ring with
    this call's KV already written, hidden [B, S, 1, slots] (ring_hidden); compressed [B, W, D] and topk [B, S, K]
    (rows of it, −1 empty) for a compressed layer. Softmax over the visible logits and the sink as one extra
    column (the reference's e^{l−M} / (Σ e^{l−M} + e^{sink−M}) with M the max of both), the probabilities cast
    to bf16 for the PV product where the reference does. Keys are summed in ring order, so only rounding
    differs. → [B, S, H, D] in q's dtype; with return_mass also the head-averaged probability mass on the
    window, the compressed rows and the sink, each [B, S] fp32 (what the trace records of a layer's attention)."""
    B, S, H, D = q.shape
    if B * S <= KERNEL_ROWS and q.device.type == "cpu" and not sync_free_active():
        if B * S > 1:   # a DSpark verify block, a batch: each query alone, as a decode step's
            return _query_by_query(q, ring, hidden, sink, compressed, topk, return_mass)
        if topk is not None:   # its valid rows in index order, whatever the call's list held besides
            listed = topk[0, 0]
            topk = listed[listed >= 0].sort().values.view(1, 1, -1)
    qf = upcast(q)
    keys, hide = upcast(ring), hidden                                         # shared by the call's queries
    per_query = None                                                          # [B, S, K, D] rows, [B, S, 1, K] hidden
    if topk is not None and topk.size(-1):
        rows = upcast(compressed[torch.arange(B, device=q.device).view(-1, 1, 1), topk.clamp_min(0)])   # [B, S, K, D]
        if S == 1:  # one query per row: its rows join the shared keys
            keys, hide = torch.cat([keys, rows[:, 0]], 1), torch.cat([hide, (topk < 0).unsqueeze(2)], -1)
        else:
            per_query = rows, (topk < 0).unsqueeze(2)
    keys_t = keys.unsqueeze(1).transpose(-1, -2)                              # [B, 1, D, N]
    if S == 1:
        logits = [torch.matmul(qf, keys_t).masked_fill(hide, float("-inf"))]  # [B, 1, H, N]
    else:
        logits = [torch.matmul(qf.view(B, 1, S * H, D), keys_t).view(B, S, H, -1).masked_fill(hide, float("-inf"))]
    if per_query is not None:
        rows, hide_q = per_query
        logits.append(torch.matmul(qf, rows.transpose(-1, -2)).masked_fill(hide_q, float("-inf")))
    n = [t.size(-1) for t in logits]
    logits.append(upcast(sink).view(1, 1, H, 1).expand(B, S, H, 1))
    p = torch.cat(logits, -1).softmax(-1)                                     # [B, S, H, N (+ K) + 1]
    mass = None
    if return_mass:
        slots = ring.size(1)
        if p.device.type == "cpu":   # one matmul: reductions over heads cost more on small CPU tensors
            mass = torch.matmul(p.view(B, S, -1), head_means(H, p.size(-1), slots, p.dtype)).unbind(-1)
        else:                        # (no constant made here: this may run inside a CUDA graph's capture)
            heads = p.mean(2)                                                 # [B, S, N + K + 1]
            mass = (heads[..., :slots].sum(-1), heads[..., slots:-1].sum(-1), heads[..., -1])
        if p.dtype != torch.float32:  # (fp32 records of a float64 model's masses, summed in float64)
            mass = tuple(m.float() for m in mass)
    if q.dtype == torch.bfloat16:  # the reference casts probabilities to the activation dtype before PV
        p = p.to(torch.bfloat16).float()
    if S == 1:
        out = torch.matmul(p[..., :n[0]], keys.unsqueeze(1))                  # [B, 1, H, D]
    else:
        out = torch.matmul(p[..., :n[0]].reshape(B, 1, S * H, n[0]), keys.unsqueeze(1)).view(B, S, H, D)
    if per_query is not None:
        out = out + torch.matmul(p[..., n[0]:n[0] + n[1]], per_query[0])
    out = cast(out, q.dtype)
    return (out, *mass) if return_mass else out


def _query_by_query(q, ring, hidden, sink, compressed, topk, return_mass):
    """window_attention of a few queries (B·S ≤ KERNEL_ROWS on the CPU) one at a time: each then takes a decode
    step's products, sums and list of compressed rows, so that a verify block's rows round as decode steps do
    (engine.speedups.row_invariant)."""
    B, S = q.shape[:2]
    rows = [[window_attention(q[b:b + 1, s:s + 1], ring[b:b + 1], _part(hidden, b, s), sink,
                              None if compressed is None else compressed[b:b + 1],
                              None if topk is None else topk[b:b + 1, s:s + 1], return_mass=return_mass)
             for s in range(S)] for b in range(B)]
    if not return_mass:
        return torch.cat([torch.cat(row, 1) for row in rows], 0)
    return tuple(torch.cat([torch.cat([part[i] for part in row], 1) for row in rows], 0) for i in range(4))


def _part(mask: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """Query (b, s)'s part of a mask [B or 1, S or 1, ...] (a size-1 axis is shared by every query)."""
    mask = mask[b:b + 1] if mask.size(0) > 1 else mask
    return mask[:, s:s + 1] if mask.size(1) > 1 else mask
