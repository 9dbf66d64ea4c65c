"""Triton kernels for routed-expert execution: grouped SwiGLU up-projection, grouped down-projection, combine."""
import triton
import triton.language as tl


@triton.jit
def _tile(tile_expert_ptr, tile_start_ptr, tile_end_ptr, BLOCK_M: tl.constexpr):
    """Rows [start, end) of the expert-sorted pairs that this program's tile covers (empty past the last
    tile), and whether it has any (spare tiles skip their matmul loop)."""
    t = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + t).to(tl.int64)
    start = tl.load(tile_start_ptr + t)
    end = tl.load(tile_end_ptr + t)
    rows = start + tl.arange(0, BLOCK_M).to(tl.int64)
    return expert, rows, rows < end, end > start


@triton.jit
def moe_gate_up_kernel(x_ptr, token_ptr, pair_weight_ptr, w1_ptr, w3_ptr, h_ptr,
                       tile_expert_ptr, tile_start_ptr, tile_end_ptr,
                       DIM, INTER, limit,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CLAMP: tl.constexpr,
                       PRECISION: tl.constexpr):
    """h[rows, cols] = SwiGLU(x[token] W1[e]ᵀ, x[token] W3[e]ᵀ) · routing weight, for one (tile, column block)."""
    expert, rows, rm, busy = _tile(tile_expert_ptr, tile_start_ptr, tile_end_ptr, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cm = cols < INTER
    token = tl.load(token_ptr + rows, mask=rm, other=0)
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_base = expert * INTER * DIM
    for k0 in range(0, tl.where(busy, DIM, 0), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < DIM
        a = tl.load(x_ptr + token[:, None] * DIM + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
        bm = km[:, None] & cm[None, :]
        b1 = tl.load(w1_ptr + w_base + cols[None, :] * DIM + k[:, None], mask=bm, other=0.0)   # [K, N] = W1ᵀ tile
        b3 = tl.load(w3_ptr + w_base + cols[None, :] * DIM + k[:, None], mask=bm, other=0.0)
        g = tl.dot(a, b1, g, input_precision=PRECISION)
        u = tl.dot(a, b3, u, input_precision=PRECISION)
    if CLAMP:  # up clamped both ways, gate only from above (engine.model.moe.swiglu)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        g = tl.minimum(g, limit)
    h = g * tl.sigmoid(g) * u
    h = h * tl.load(pair_weight_ptr + rows, mask=rm, other=0.0)[:, None]   # routing weight applied before W2
    tl.store(h_ptr + rows[:, None] * INTER + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=rm[:, None] & cm[None, :])


@triton.jit
def moe_down_kernel(h_ptr, w2_ptr, y_ptr, tile_expert_ptr, tile_start_ptr, tile_end_ptr,
                    DIM, INTER,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """y[rows, cols] = h[rows] W2[e]ᵀ in fp32, for one (tile, column block)."""
    expert, rows, rm, busy = _tile(tile_expert_ptr, tile_start_ptr, tile_end_ptr, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cm = cols < DIM
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_base = expert * DIM * INTER
    for k0 in range(0, tl.where(busy, INTER, 0), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < INTER
        a = tl.load(h_ptr + rows[:, None] * INTER + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
        b = tl.load(w2_ptr + w_base + cols[None, :] * INTER + k[:, None], mask=km[:, None] & cm[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(y_ptr + rows[:, None] * DIM + cols[None, :], acc, mask=rm[:, None] & cm[None, :])


@triton.jit
def moe_combine_kernel(y_ptr, slot_ptr, out_ptr, DIM, K: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[t] = Σ_j y[slot[t, j]]: each token gathers its K expert outputs (no atomics, deterministic)."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < DIM
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in tl.static_range(K):
        row = tl.load(slot_ptr + t * K + j)
        acc += tl.load(y_ptr + row * DIM + d, mask=dm, other=0.0)
    tl.store(out_ptr + t * DIM + d, acc, mask=dm)
