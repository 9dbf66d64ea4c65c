"""mHC seams recorded as the fused seam holds them (pre, [combᵀ | post]); when read, unpacked and given their
Sinkhorn residuals, derived for all records at once instead of a few torch ops per call."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # tensors come from the model's side: named for annotations only
    from .arrays import Array

MIX_KIND = "mhc_mix"   # a seam recorded as (pre, mix) without its residuals, until the trace is read


def derives_later(t: Array) -> bool:
    """Whether residuals derived later from t's fp32 record are the bits the call would compute now: an fp32
    tensor or array on the host (another dtype or a GPU's reductions may round otherwise: derived at once)."""
    if isinstance(t, np.ndarray):
        return t.dtype == np.float32
    return getattr(t, "is_cpu", False) and str(t.dtype) == "torch.float32"


def stochastic_errors(comb: Array) -> tuple[Array, Array]:
    """comb [..., hc, hc] (a tensor, or an array) → (max |row sum − 1|, max |column sum − 1|) per matrix, each
    [...], in comb's dtype and on its device: engine.model.mhc.stochastic_error (imported here: torch loads only
    when a trace is read or recorded, not with this module)."""
    # torch loads only when this runs, not with the trace package: a saved trace opens without it
    import torch

    from ..model.mhc import stochastic_error
    if isinstance(comb, np.ndarray):
        return tuple(e.numpy() for e in stochastic_error(torch.from_numpy(comb)))
    return stochastic_error(comb)


def post_comb(mix: Array) -> tuple[Array, Array]:
    """mix [..., hc, hc + 1] = [combᵀ | post] (row e: column e of comb, then post_e) → (post [..., hc], comb
    [..., hc, hc]) as views (engine.speedups.fast_mhc.Seam's layout)."""
    comb_t = mix[..., :-1]
    return mix[..., -1], (comb_t.swapaxes(-1, -2) if isinstance(mix, np.ndarray) else comb_t.transpose(-1, -2))


def packed_mix(post: Array, comb: Array) -> Array:
    """(post [..., hc], comb [..., hc, hc]) → mix [..., hc, hc + 1] = [combᵀ | post] (a new tensor or array)."""
    if isinstance(comb, np.ndarray):
        return np.concatenate([comb.swapaxes(-1, -2), np.asarray(post)[..., None]], -1)
    # torch loads only when this runs, not with the trace package: a saved trace opens without it
    import torch
    return torch.cat([comb.transpose(-1, -2), post.unsqueeze(-1).to(comb.dtype)], -1)


def seam_values(pre: np.ndarray, mix: np.ndarray) -> list[np.ndarray]:
    """The "mhc" fields of m recorded seams, pre [m, hc] and mix [m, hc, hc + 1] (fp32) → [pre, post [m, hc],
    comb [m, hc, hc], row_err [m], col_err [m]]: the residuals computed for all m at once (the same reductions
    per matrix, so the bits a call computes)."""
    post, comb = post_comb(mix)
    comb = np.ascontiguousarray(comb)
    return [pre, np.ascontiguousarray(post), comb, *stochastic_errors(comb)]
