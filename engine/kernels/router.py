"""Triton kernel for the MoE router: fp32 scores, sqrt-softplus, selection bias, top-k, renormalise, scale."""
import triton
import triton.language as tl


@triton.jit
def _softplus(x):
    """log(1 + e^x) as torch's F.softplus (threshold 20), with an accurate log1p for tiny e^-|x|."""
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    # log1p(e) = log(u)·e/(u − 1): the rounding of u cancels (Goldberg's trick); exact e when u rounds to 1
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def router_kernel(x_ptr, w_ptr, bias_ptr, bias_vl_ptr, vision_ptr,
                  weights_ptr, ids_ptr, chosen_ptr,
                  DIM, E, temp, route_scale,
                  K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_DIM: tl.constexpr,
                  HAS_VISION: tl.constexpr, NORMALIZE: tl.constexpr):
    """One token per program: logits over all E experts, then K rounds of (max, lowest index at the max)."""
    n = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    em = e < E
    logits = tl.zeros([BLOCK_E], dtype=tl.float32)
    for k0 in range(0, DIM, BLOCK_DIM):
        k = k0 + tl.arange(0, BLOCK_DIM)
        km = k < DIM
        x = tl.load(x_ptr + n * DIM + k, mask=km, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + e[:, None] * DIM + k[None, :], mask=em[:, None] & km[None, :], other=0.0).to(tl.float32)
        logits += tl.sum(w * x[None, :], axis=1)
    scores = tl.sqrt(_softplus(logits / temp))
    bias = tl.load(bias_ptr + e, mask=em, other=0.0)
    if HAS_VISION:
        if tl.load(vision_ptr + n) != 0:
            bias = tl.load(bias_vl_ptr + e, mask=em, other=0.0)
    select = tl.where(em, scores + bias, float("-inf"))          # the bias only chooses; weights use scores
    slot = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    chosen = tl.zeros([BLOCK_K], dtype=tl.float32)
    for i in tl.static_range(K):
        best = tl.max(select, axis=0)
        idx = tl.min(tl.where(select == best, e, BLOCK_E), axis=0)
        ids = tl.where(slot == i, idx.to(tl.int64), ids)
        chosen = tl.where(slot == i, tl.sum(tl.where(e == idx, scores, 0.0), axis=0), chosen)
        select = tl.where(e == idx, float("-inf"), select)
    weights = chosen
    if NORMALIZE:
        weights = weights / (tl.sum(chosen, axis=0) + 1e-20)
    sm = slot < K
    tl.store(weights_ptr + n * K + slot, weights * route_scale, mask=sm)
    tl.store(ids_ptr + n * K + slot, ids, mask=sm)
    tl.store(chosen_ptr + n * K + slot, chosen, mask=sm)
