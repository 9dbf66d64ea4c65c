"""mHC seams in fewer ops: one fused mixes step, a C++ (or Python-float) Sinkhorn for few tokens, collapse and expand
as matmuls."""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import cpu_seam
from .casts import cast
from .derived import derived
from .row_invariant import few_rows_linear
from .sinkhorn import fast_sinkhorn, scalar_sinkhorn
from .sync_free import sync_free_active


@dataclass
class Seam:
    """One site's mixes for a call: pre [B, S, hc] and, for expand, mix [B, S, hc, hc + 1] = [combᵀ | post], so
    that X'_e = Σ_a C[a][e]·X_a + post_e·F is one matmul of mix with [X ; F]. post and comb are made only when
    asked for (the trace records them)."""
    pre: torch.Tensor
    mix: torch.Tensor

    @property
    def post(self) -> torch.Tensor:
        return self.mix[..., -1]                                              # [B, S, hc]

    @property
    def comb(self) -> torch.Tensor:
        return self.mix[..., :-1].transpose(-1, -2)                           # [B, S, a, b]


# calls of at most this many tokens on the CPU compute their mixes on Python floats (_few_tokens)
FEW_TOKENS = 8
# a site's parameter names, looked up in the block's parameter dict (nn.Module.__getattr__ is slow at this rate)
SITE_PARAMS = {site: tuple(f"hc_{site}_{k}" for k in ("fn", "scale", "base")) for site in ("attn", "ffn")}


def seam_mixes(block, xf: torch.Tensor, site: str) -> Seam:
    """xf [B, S, hc, D] (fp32, or float64) → the site's Seam: engine.model.mhc.hc_mixes up to float rounding.
    The RMS statistic scales the input instead of the projection (F.rms_norm, one op) and scale and base act on
    the whole mixes vector at once; on the CPU everything after the projection (RMS factors, sigmoids, the
    Sinkhorn) runs token by token in double precision (_few_tokens), packed back into one tensor: for a few tokens
    always, for many (a prefill) where the C++ kernel built, since its loop costs ~1 µs a token against ~120
    numpy ops over stacks of hc×hc matrices (a quarter of a 512-token prefill on one thread)."""
    B, S, hc, D = xf.shape
    fn, scale, base = (block._parameters[name] for name in SITE_PARAMS[site])
    flat = xf.view(B, S, hc * D)                                              # [B, S, hc·D]
    if xf.device.type == "cpu" and not sync_free_active() and (B * S <= FEW_TOKENS or cpu_seam.load() is not None):
        return _few_tokens(block, flat, fn, scale, base, site, hc)   # a prefill too: the kernel's loop is the cheap one
    mixes = F.linear(F.rms_norm(flat, (hc * D,), None, block.norm_eps), fn)   # [B, S, 2hc + hc²]
    # scale[0] on the pre entries, scale[1] on post, scale[2] on the hc² comb logits
    full = derived(block).get(f"{site}.scale", (scale,), lambda: torch.cat(
        [scale[0:1].expand(hc), scale[1:2].expand(hc), scale[2:3].expand(hc * hc)]))
    z = mixes * full + base.to(xf.dtype)
    gates = torch.sigmoid(z[..., :2 * hc])
    pre = gates[..., :hc] + block.hc_eps
    comb = fast_sinkhorn(z[..., 2 * hc:].unflatten(-1, (hc, hc)), block.iters, block.hc_eps)
    mix = torch.cat([comb.transpose(-1, -2), 2 * gates[..., hc:].unsqueeze(-1)], -1)   # [B, S, hc, hc + 1]
    return Seam(pre, mix)


def _few_tokens(block, flat: torch.Tensor, fn, scale, base, site: str, hc: int) -> Seam:
    """seam_mixes for a few tokens (a decode step, a DSpark verify block): the projection and the inputs' norms
    as two ops, then the rest in double precision token by token, in the C++ kernel of engine.kernels.cpu_seam
    where it builds, else on Python floats (_python_floats; the same operations in the same order, so the
    same bits); one tensor back holding every pre, then every mix."""
    B, S, width = flat.shape
    norms = torch.linalg.vector_norm(flat, dim=-1).view(-1)                 # [B·S]
    mixes = few_rows_linear(flat, fn)                   # each token's row alike at any count (row_invariant)
    mixes = (F.linear(flat, fn) if mixes is None else mixes).view(B * S, -1)   # [B·S, 2hc + hc²], before RMS
    kernel = cpu_seam.load()                                                  # built or loaded on first use
    if kernel is not None:
        s, b = derived(block).get(f"{site}.float64", (scale, base), lambda: (scale.double(), base.double()))
        packed = kernel.seam_mixes(mixes, norms, s, b, hc, width, block.iters, block.hc_eps, block.norm_eps)
    else:
        packed = _python_floats(block, mixes, norms, scale, base, site, hc, width)
    n = B * S * hc
    return Seam(packed[:n].view(B, S, hc), packed[n:].view(B, S, hc, hc + 1))


def _python_floats(block, mixes: torch.Tensor, norms: torch.Tensor, scale, base, site: str, hc: int,
                   width: int) -> torch.Tensor:
    """The kernel's work on Python floats: mixes [N, 2hc + hc²], norms [N] → [N·hc pre, then N·hc·(hc + 1) mix]
    in mixes' dtype (a 4×4 Sinkhorn costs ~12 µs so, against ~120 numpy or torch ops for any number of
    tokens)."""
    s_pre, s_post, s_comb, b = derived(block).get(f"{site}.lists", (scale, base), lambda: (*scale.tolist(),
                                                                                           base.tolist()))
    eps, sinkhorn = block.hc_eps, scalar_sinkhorn(hc)
    pre, mix = [], []
    for norm, m in zip(norms.tolist(), mixes.tolist()):
        r = 1.0 / math.sqrt(norm * norm / width + block.norm_eps)            # rsqrt(mean(x²) + eps)
        pre += [_sigmoid(m[i] * r * s_pre + b[i]) + eps for i in range(hc)]
        post = [2 * _sigmoid(m[i] * r * s_post + b[i]) for i in range(hc, 2 * hc)]
        comb = sinkhorn([m[i] * r * s_comb + b[i] for i in range(2 * hc, 2 * hc + hc * hc)], block.iters, eps)
        mix += [v for e in range(hc) for v in (*comb[e::hc], post[e])]       # row e: column e of comb, then post_e
    return torch.frombuffer(array("d" if mixes.dtype == torch.float64 else "f", pre + mix), dtype=mixes.dtype)


def _sigmoid(v: float) -> float:
    if v >= 0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)  # never overflows for v < 0
    return e / (1.0 + e)


def pin_identity(block, ctx, seam: Seam) -> Seam:
    """The seam with comb = I where an mhc-identity intervention names the block's layer (as
    engine.model.block.Block.mixes pins it; pre and post kept); the seam itself when none does."""
    pinned = ctx.interventions.mhc_identity(block.role.layer, ctx.positions)     # [B, S] or None
    if pinned is None:
        return seam
    eye = torch.eye(seam.pre.size(-1), dtype=seam.mix.dtype, device=seam.mix.device)   # Iᵀ = I
    comb_t = torch.where(pinned[..., None, None], eye, seam.mix[..., :-1])        # [B, S, hc, hc]
    return Seam(seam.pre, torch.cat([comb_t, seam.mix[..., -1:]], -1))


def record_seam(block, ctx, site: str, seam: Seam) -> None:
    """The trace call of engine.model.block.Block.mixes, with this seam's tensors."""
    rows, pos = ctx.trace_rows()
    ctx.trace.record_mhc_mix(block.path, site, rows, pos, seam.pre, seam.mix)   # (the trace unpacks it when read)


def collapse(xf: torch.Tensor, pre: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σ_c pre_c · X_c as one matmul: xf [B, S, hc, D] and pre [B, S, hc] (both fp32 or float64) → [B, S, D]
    in `dtype`."""
    return cast(torch.matmul(pre.unsqueeze(-2), xf).squeeze(-2), dtype)


def expand(f: torch.Tensor, xf: torch.Tensor, seam: Seam) -> torch.Tensor:
    """X'_e = Σ_a C[a][e]·X_a + post_e·F as one matmul of [combᵀ | post] with [X ; F]: f [B, S, D],
    xf [B, S, hc, D] (fp32) → [B, S, hc, D] fp32."""
    return torch.matmul(seam.mix, torch.cat([xf, cast(f, xf.dtype).unsqueeze(-2)], -2))

