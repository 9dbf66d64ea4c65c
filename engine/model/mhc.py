"""mHC (spec §4.2): mixes from the flattened streams, Sinkhorn in fp32, collapse and expand."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .norm import upcast


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[..., hc, hc] logits C[a][b] → doubly stochastic matrix, the reference's exact op order:
    row softmax + eps, column normalise, then (iters − 1) × (row, column) normalisations."""
    c = torch.exp(logits - logits.amax(-1, keepdim=True))
    c = c / c.sum(-1, keepdim=True) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_mixes(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
             iters: int, hc_eps: float, norm_eps: float,
             sinkhorn: Callable = sinkhorn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, S, hc, D] → pre [B,S,hc], post [B,S,hc], comb [B,S,hc,hc] (all fp32 or float64).
    sinkhorn: the projection onto doubly stochastic matrices (default the reference above)."""
    hc = x.size(2)
    xf = upcast(x.flatten(2))  # [B, S, hc·D]
    # one RMS statistic per token over the whole flattened width
    mixes = F.linear(xf, upcast(fn)) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps)
    scale, base = upcast(scale), upcast(base)
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))  # [B, S, a, b]
    comb = sinkhorn(logits, iters, hc_eps)
    return pre, post, comb


def collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Σ_c pre_c · X_c: [B, S, hc, D] × [B, S, hc] → [B, S, D] (math in fp32)."""
    return (pre.unsqueeze(-1) * upcast(x)).sum(2).to(x.dtype)


def expand(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_b = post_b · F + Σ_a C[a][b] · X_a: F [B,S,D], X [B,S,hc,D] → [B,S,hc,D]."""
    mixed = torch.einsum("nsad,nsae->nsed", upcast(residual), comb)  # over source a
    return (post.unsqueeze(-1) * upcast(f).unsqueeze(-2) + mixed).to(residual.dtype)


def stochastic_error(comb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Max |row sum − 1| and max |column sum − 1| per token: [B,S,hc,hc] → ([B,S], [B,S])."""
    return (comb.sum(-1) - 1).abs().amax(-1), (comb.sum(-2) - 1).abs().amax(-1)
