"""Launchers: check the inputs, allocate the outputs, pick block sizes and grids, and run the Triton kernels."""
from __future__ import annotations

import torch

from ..model.quant import fp8_qdq
from .runtime import KERNEL_DTYPES, KernelInputError, block, check, compiled_for, require

F32 = (torch.float32,)
# Interpreted programs run one after another in numpy: wide blocks mean fewer, cheaper loop turns there.
# On a GPU narrower blocks keep the per-program tiles in registers.


def _wide(device: torch.device) -> bool:
    return device.type == "cpu"


# ---- (a) mHC seam ---------------------------------------------------------------------------------------
def mhc_seam(x: torch.Tensor, *, fn: torch.Tensor | None = None, scale: torch.Tensor | None = None,
             base: torch.Tensor | None = None, iters: int = 20, hc_eps: float = 1e-6, norm_eps: float = 1e-6,
             carry: torch.Tensor | None = None, f: torch.Tensor | None = None, post_in: torch.Tensor | None = None,
             comb_in: torch.Tensor | None = None):
    """One launch for any subset of a seam's three steps on x [B, S, hc, D]:
    expand (f [B,S,D], post_in [B,S,hc], comb_in [B,S,hc,hc] given) → X' = post_in·F + Σ_a comb_in[a][b]·X_a;
    mixes (fn [(2+hc)·hc, hc·D], scale [3], base [(2+hc)·hc] given) → pre, post, comb of X' (fp32);
    collapse (carry [B,S,hc] given) → Σ_c carry_c·X'_c [B, S, D].
    Returns (x_out or None, pre, post, comb or Nones, collapsed or None)."""
    require(x.device)
    dev = x.device
    x = check(x, "x", shape=(None, None, None, None), dtypes=KERNEL_DTYPES, device=dev)
    B, S, hc, D = x.shape
    if hc < 1 or hc & (hc - 1):
        raise KernelInputError(f"x has {hc} streams; the mHC kernel needs a power of two (hc_mult)")
    expand, mix, collapse = f is not None, fn is not None, carry is not None
    if not (expand or mix or collapse):
        raise KernelInputError("mhc_seam needs at least one of f (expand), fn (mixes) or carry (collapse)")
    if expand:
        if post_in is None or comb_in is None:
            raise KernelInputError("expand needs f, post_in and comb_in together")
        f = check(f, "f", shape=(B, S, D), dtypes=KERNEL_DTYPES, device=dev)
        post_in = check(post_in, "post_in", shape=(B, S, hc), dtypes=F32, device=dev)
        comb_in = check(comb_in, "comb_in", shape=(B, S, hc, hc), dtypes=F32, device=dev)
    if mix:
        if scale is None or base is None:
            raise KernelInputError("mixes need fn, scale and base together")
        if iters < 1:
            raise KernelInputError(f"Sinkhorn needs at least 1 iteration, got {iters}")
        mix_dim = (2 + hc) * hc
        fn = check(fn, "fn", shape=(mix_dim, hc * D), dtypes=F32, device=dev)
        scale = check(scale, "scale", shape=(3,), dtypes=F32, device=dev)
        base = check(base, "base", shape=(mix_dim,), dtypes=F32, device=dev)
    if collapse:
        carry = check(carry, "carry", shape=(B, S, hc), dtypes=F32, device=dev)
    # triton is optional (the gpu extra): the kernel module loads only when launched
    from .mhc_seam import mhc_seam_kernel

    x_out = torch.empty_like(x) if expand else None
    pre = torch.empty(B, S, hc, dtype=torch.float32, device=dev) if mix else None
    post = torch.empty_like(pre) if mix else None
    comb = torch.empty(B, S, hc, hc, dtype=torch.float32, device=dev) if mix else None
    collapsed = torch.empty(B, S, D, dtype=x.dtype, device=dev) if collapse else None
    dummy = x  # unused pointer slots (their branch is compiled out)
    n = B * S
    if n:
        compiled_for(mhc_seam_kernel, dev)[(n,)](
            x, f if expand else dummy, post_in if expand else dummy, comb_in if expand else dummy,
            x_out if expand else dummy, fn if mix else dummy, scale if mix else dummy, base if mix else dummy,
            pre if mix else dummy, post if mix else dummy, comb if mix else dummy,
            carry if collapse else dummy, collapsed if collapse else dummy,
            D, iters, hc_eps, norm_eps,
            HC=hc, BLOCK_D=block(D, 256 if _wide(dev) else 64), EXPAND=expand, MIX=mix, COLLAPSE=collapse)
    return x_out, pre, post, comb, collapsed


# ---- (b) router -----------------------------------------------------------------------------------------
def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, topk: int, temp: float = 1.0,
          route_scale: float = 1.0, normalize: bool = True, bias_vl: torch.Tensor | None = None,
          vision: torch.Tensor | None = None):
    """x [N, dim], weight [E, dim], bias [E] fp32 → (weights [N, k] fp32, ids [N, k] int64, chosen [N, k] fp32),
    ids in descending order of score + bias (ties: lowest expert id); weights = chosen (renormalised) · scale."""
    require(x.device)
    dev = x.device
    x = check(x, "x", shape=(None, None), dtypes=KERNEL_DTYPES, device=dev)
    N, dim = x.shape
    weight = check(weight, "weight", shape=(None, dim), dtypes=KERNEL_DTYPES, device=dev)
    E = weight.size(0)
    bias = check(bias, "bias", shape=(E,), dtypes=F32, device=dev)
    if not 1 <= topk <= E:
        raise KernelInputError(f"topk must lie in 1..{E} (the number of experts), got {topk}")
    if temp <= 0:
        raise KernelInputError(f"gate temperature must be > 0, got {temp}")
    has_vision = vision is not None
    if has_vision:
        if bias_vl is None:
            raise KernelInputError("vision given without bias_vl")
        bias_vl = check(bias_vl, "bias_vl", shape=(E,), dtypes=F32, device=dev)
        vision = check(vision, "vision", shape=(N,), dtypes=(torch.bool,), device=dev).to(torch.int8)
    # triton is optional (the gpu extra): the kernel module loads only when launched
    from .router import router_kernel

    weights = torch.empty(N, topk, dtype=torch.float32, device=dev)
    ids = torch.empty(N, topk, dtype=torch.int64, device=dev)
    chosen = torch.empty(N, topk, dtype=torch.float32, device=dev)
    block_e = block(E, 1 << 20)
    if N:
        compiled_for(router_kernel, dev)[(N,)](x, weight, bias, bias_vl if has_vision else bias,
                            vision if has_vision else bias,
                            weights, ids, chosen, dim, E, float(temp), float(route_scale),
                            K=topk, BLOCK_K=block(topk, 1 << 20), BLOCK_E=block_e,
                            BLOCK_DIM=block(dim, max(16, 8192 // block_e) if not _wide(dev) else 512),
                            HAS_VISION=has_vision, NORMALIZE=normalize and topk > 1)
    return weights, ids, chosen


# ---- (c) MoE expert execution ---------------------------------------------------------------------------
def expert_tiles(ids: torch.Tensor, n_experts: int, block_m: int):
    """Sort the (token, slot) pairs by expert and cut each expert's run into tiles of ≤ block_m rows, all on
    the device without a host sync: the grid is the upper bound ceil(P/block_m) + min(E, P) and spare
    tiles are empty. Returns (order [P], tile_expert, tile_start, tile_end, slot [P] = sorted row of pair p)."""
    flat = ids.flatten()                                                   # [P] pair p = token·k + slot
    P, dev = flat.numel(), flat.device
    order = flat.argsort(stable=True)
    sorted_ids = flat[order]
    bounds = torch.searchsorted(sorted_ids, torch.arange(n_experts + 1, device=dev))   # expert e: rows [b_e, b_e+1)
    counts = bounds[1:] - bounds[:-1]
    tiles = (counts + block_m - 1) // block_m
    tiles_end = tiles.cumsum(0)
    n_tiles = -(-P // block_m) + min(n_experts, P)
    t = torch.arange(n_tiles, device=dev)
    expert = torch.searchsorted(tiles_end, t, right=True)                  # expert owning tile t (E = spare)
    valid = expert < n_experts
    e = expert.clamp(max=n_experts - 1)
    start = bounds[:-1][e] + (t - (tiles_end - tiles)[e]) * block_m
    end = torch.minimum(start + block_m, bounds[1:][e])
    start, end = torch.where(valid, start, 0), torch.where(valid, end, 0)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(P, device=dev)
    return order, e.contiguous(), start.contiguous(), end.contiguous(), slot


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                w3: torch.Tensor, *, limit: float = 0.0, act_quant: bool = False) -> torch.Tensor:
    """Σ_j weights[t, j] · Expert_{ids[t, j]}(x[t]) → [N, dim] fp32, with SwiGLU (clamped when limit > 0).
    x [N, dim]; weights, ids [N, k]; w1, w3 [E, inter, dim]; w2 [E, dim, inter]. act_quant: the FP8
    quant-dequant of expert inputs (x and the hidden h) that the reference applies before each matmul."""
    require(x.device)
    dev = x.device
    x = check(x, "x", shape=(None, None), dtypes=KERNEL_DTYPES, device=dev)
    N, dim = x.shape
    w1 = check(w1, "w1", shape=(None, None, dim), dtypes=KERNEL_DTYPES, device=dev)
    E, inter = w1.shape[:2]
    w3 = check(w3, "w3", shape=(E, inter, dim), dtypes=(w1.dtype,), device=dev)
    w2 = check(w2, "w2", shape=(E, dim, inter), dtypes=(w1.dtype,), device=dev)
    ids = check(ids, "ids", shape=(N, None), dtypes=(torch.int64, torch.int32), device=dev)
    k = ids.size(1)
    weights = check(weights, "weights", shape=(N, k), dtypes=F32, device=dev)
    if dev.type == "cpu" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= E):
        raise KernelInputError(f"expert ids must lie in 0..{E - 1}, found {int(ids.min())}..{int(ids.max())}")
    # triton is optional (the gpu extra): the kernel module loads only when launched
    from .moe_experts import moe_combine_kernel, moe_down_kernel, moe_gate_up_kernel

    out = torch.zeros(N, dim, dtype=torch.float32, device=dev)
    if N == 0 or k == 0:
        return out
    P = N * k
    block_m = 16                                                           # tl.dot's smallest tile on a GPU
    order, t_exp, t_start, t_end, slot = expert_tiles(ids, E, block_m)
    token = (order // k).contiguous()
    pair_w = weights.flatten()[order].contiguous()
    xin = (fp8_qdq(x) if act_quant else x).to(w1.dtype).contiguous()       # the reference casts to the weight dtype
    h = torch.empty(P, inter, dtype=x.dtype, device=dev)                   # hidden rows in expert-sorted order
    cap = 256 if _wide(dev) else 64
    # fp32 weights: full-precision products like torch's default (TF32 off); 16-bit inputs ignore the setting
    precision = "ieee" if w1.dtype == torch.float32 else "tf32"
    bn, bk = block(inter, cap, 16), block(dim, cap, 16)
    compiled_for(moe_gate_up_kernel, dev)[(t_exp.numel(), -(-inter // bn))](
        xin, token, pair_w, w1, w3, h, t_exp, t_start, t_end, dim, inter, float(limit),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, CLAMP=limit > 0, PRECISION=precision)
    h = (fp8_qdq(h) if act_quant else h).to(w2.dtype).contiguous()
    y = torch.empty(P, dim, dtype=torch.float32, device=dev)
    bn, bk = block(dim, cap, 16), block(inter, cap, 16)
    moe_down_kernel[(t_exp.numel(), -(-dim // bn))](h, w2, y, t_exp, t_start, t_end, dim, inter,
                                                    BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision)
    bd = block(dim, 1024 if _wide(dev) else 256)
    moe_combine_kernel[(N, -(-dim // bd))](y, slot.contiguous(), out, dim, K=k, BLOCK_D=bd)
    return out


# ---- (d) Engram -----------------------------------------------------------------------------------------
def engram_gather(table: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """table [R, hd], row_ids [..., cols] → rows [..., cols·hd] (an exact copy of the selected rows)."""
    require(table.device)
    dev = table.device
    table = check(table, "table", shape=(None, None), device=dev)
    row_ids = check(row_ids, "row_ids", dtypes=(torch.int64, torch.int32), device=dev)
    R, hd = table.shape
    cols = row_ids.size(-1) if row_ids.dim() else 0
    if row_ids.dim() < 1 or cols == 0:
        raise KernelInputError(f"row_ids must be [..., cols] with cols ≥ 1, got shape {list(row_ids.shape)}")
    if dev.type == "cpu" and row_ids.numel() and (int(row_ids.min()) < 0 or int(row_ids.max()) >= R):
        raise KernelInputError(f"Engram row ids must lie in 0..{R - 1}, "
                               f"found {int(row_ids.min())}..{int(row_ids.max())}")
    # triton is optional (the gpu extra): the kernel module loads only when launched
    from .engram import engram_gather_kernel

    n = row_ids.numel() // cols
    out = torch.empty(*row_ids.shape[:-1], cols * hd, dtype=table.dtype, device=dev)
    if n:
        compiled_for(engram_gather_kernel, dev)[(n,)](table, row_ids, out, cols, hd, BLOCK_C=block(cols, 1 << 20),
                                   BLOCK_H=block(hd, 1 << 20))
    return out


def engram_gate_add(h: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, *,
                    eps: float, live: torch.Tensor | None = None):
    """h [B, S, hc, D], kv [B, S, (hc+1)·D] (keys then value), q/k weights [hc, D], live [B, S] bool →
    (h + gate·value [B, S, hc, D] in h's dtype, gates [B, S, hc] fp32)."""
    require(h.device)
    dev = h.device
    h = check(h, "h", shape=(None, None, None, None), dtypes=KERNEL_DTYPES, device=dev)
    B, S, hc, D = h.shape
    if hc < 1 or hc & (hc - 1):
        raise KernelInputError(f"h has {hc} streams; the Engram kernel needs a power of two (hc_mult)")
    kv = check(kv, "kv", shape=(B, S, (hc + 1) * D), dtypes=KERNEL_DTYPES, device=dev)
    q_weight = check(q_weight, "q_weight", shape=(hc, D), dtypes=KERNEL_DTYPES, device=dev)
    k_weight = check(k_weight, "k_weight", shape=(hc, D), dtypes=KERNEL_DTYPES, device=dev)
    if live is not None:
        live = check(live, "live", shape=(B, S), dtypes=(torch.bool,), device=dev).to(torch.int8)
    # triton is optional (the gpu extra): the kernel module loads only when launched
    from .engram import engram_gate_add_kernel

    out = torch.empty_like(h)
    gates = torch.empty(B, S, hc, dtype=torch.float32, device=dev)
    if B * S:
        compiled_for(engram_gate_add_kernel, dev)[(B * S,)](h, kv, q_weight, k_weight,
                                         live if live is not None else h, out, gates,
                                         D, float(eps), float(D) ** -0.5, HC=hc,
                                         BLOCK_D=block(D, 1024 if _wide(dev) else 128), HAS_LIVE=live is not None)
    return out, gates
