"""`sparse_attn` (spec §3.5): one shared K=V head, per-query index lists (−1 = empty), per-head sink."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .norm import upcast


def gather_rows(kv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The rows of kv [B, N, D] that idx [B, s, K] lists → [B, s, K, D] (an empty entry, −1, reads row 0; the
    attention masks it)."""
    batch = torch.arange(kv.size(0), device=kv.device).view(-1, 1, 1)
    return kv[batch, idx.clamp_min(0)]


def sparse_attn(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float,
                *, query_block: int = 256, return_probs: bool = False,
                gather: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = gather_rows,
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, S, H, D], kv [B, N, D], sink [H], idx [B, S, K] int64 → out [B, S, H, D] in q's dtype.

    p_j = e^{l_j} / (Σ_j e^{l_j} + e^{sink_h}) over the listed rows, l = (q·kv)·scale; the sink is not
    scaled and only enters the denominator. Empty entries contribute nothing; an all-empty row gives 0.
    With return_probs, also returns (p [B,S,H,K], sink_p [B,S,H]) in fp32. `gather` reads the listed rows (an
    equivalent may replace gather_rows: engine.speedups).
    """
    if idx.size(-1) == 0:
        out = q.new_zeros(q.shape)
        empty = (q.new_zeros(*q.shape[:3], 0, dtype=torch.float32), q.new_zeros(q.shape[:3], dtype=torch.float32))
        return (out, *empty) if return_probs else out
    outs, probs, sinks = [], [], []
    for s0 in range(0, q.size(1), query_block):
        qb, ib = q[:, s0:s0 + query_block], idx[:, s0:s0 + query_block]
        valid = ib >= 0
        rows = upcast(gather(kv, ib))  # [B, s, K, D]
        logits = torch.einsum("bshd,bskd->bshk", upcast(qb), rows) * scale
        logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
        sink_l = upcast(sink).view(1, 1, -1)
        # stabilise with max(logits, sink): mathematically the reference's e^{l−M}/(Σe^{l−M}+e^{sink−M})
        m = torch.maximum(logits.amax(-1), sink_l)
        e = torch.exp(logits - m.unsqueeze(-1))
        denom = e.sum(-1) + torch.exp(sink_l - m)
        p = e / denom.unsqueeze(-1)
        # the reference casts probabilities to the activation dtype (bf16) before the PV product
        pv = p.to(q.dtype) if q.dtype == torch.bfloat16 else p
        outs.append(torch.einsum("bshk,bskd->bshd", upcast(pv), rows).to(q.dtype))
        if return_probs:
            probs.append(p.float())
            sinks.append((torch.exp(sink_l - m) / denom).float())
    out = torch.cat(outs, 1)
    return (out, torch.cat(probs, 1), torch.cat(sinks, 1)) if return_probs else out


def sparse_attn_reference(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """Slow loop over (batch, query, head): the definition the vectorised version is tested against."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.size(0)):
        for s in range(q.size(1)):
            ids = [int(i) for i in idx[b, s] if i >= 0]
            for h in range(q.size(2)):
                if not ids:
                    continue
                logits = torch.stack([(q[b, s, h].double() @ kv[b, i].double()) * scale for i in ids])
                w = torch.exp(logits) / (torch.exp(logits).sum() + torch.exp(sink[h].double()))
                out[b, s, h] = (w.unsqueeze(-1) * kv[b, ids].double()).sum(0)
    return out
