"""mHC (spec §4.2): mixes from the flattened streams, Sinkhorn in fp32, collapse and expand; V4's learned hc_head."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..spec.config import ModelArgs
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
    """Max |row sum − 1| and max |column sum − 1| per matrix: [..., hc, hc] → ([...], [...])."""
    return (comb.sum(-1) - 1).abs().amax(-1), (comb.sum(-2) - 1).abs().amax(-1)


class HCHead(nn.Module):
    """The V4 family's learned final collapse (spec §11): pre = sigmoid(mixes · scale + base) + hc_eps from the
    RMS-normalised flattened streams (no post, no Sinkhorn), then Σ_c pre_c · X_c. A base class of the modules
    that own one (the Transformer; the last V4 DSpark stage): `add_hc_head` puts the parameters on the owner
    under the checkpoint's flat names hc_head_fn [hc, hc·dim], hc_head_base [hc], hc_head_scale [1]."""

    def add_hc_head(self, args: ModelArgs, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> None:
        fp32 = torch.float64 if dtype == torch.float64 else torch.float32
        self.hc_head_fn = nn.Parameter(torch.zeros(args.hc_mult, args.hc_dim, dtype=fp32, device=device))
        self.hc_head_base = nn.Parameter(torch.zeros(args.hc_mult, dtype=fp32, device=device))
        self.hc_head_scale = nn.Parameter(torch.ones(1, dtype=fp32, device=device))
        self.hc_head_eps, self.hc_head_norm_eps = args.hc_eps, args.norm_eps

    def hc_head(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, hc, D] → [B, S, D]."""
        xf = upcast(x.flatten(2))                                             # [B, S, hc·D]
        mixes = F.linear(xf, upcast(self.hc_head_fn)) * torch.rsqrt(xf.square().mean(-1, keepdim=True)
                                                                    + self.hc_head_norm_eps)
        pre = torch.sigmoid(mixes * upcast(self.hc_head_scale) + upcast(self.hc_head_base)) + self.hc_head_eps
        return collapse(x, pre)
