"""Triton kernel for routed experts with MXFP4 weights (spec §2.2, §3.4): FP8 activations (block 32) times E2M1
weights packed two per byte (low nibble = element 2j), one E8M0 scale per 32 inputs of a weight row; the
nibbles are unpacked to E4M3 in the kernel (every E2M1 value is one) and multiplied as FP8."""
import triton
import triton.language as tl

from .fp8_gemm import QBLOCK, e8m0_value


@triton.jit
def e2m1_as_e4m3(nibble):
    """E2M1 codes (bit 3 sign, bits 0-2 index into 0, .5, 1, 1.5, 2, 3, 4, 6) → the same values' E4M3 bytes
    (int32): 0 → 0x00, 0.5 → 0x30, and from 1 on the magnitude bits m map to (m + 12) << 2."""
    m = nibble & 7
    bits = tl.where(m >= 2, (m + 12) << 2, m * 0x30)
    return bits | ((nibble & 8) << 4)


@triton.jit
def fp4_expert_gemm_kernel(a_ptr, a_scale_ptr, a_row_ptr, w_ptr, w_scale_ptr, c_ptr,
                           tile_expert_ptr, tile_start_ptr, tile_end_ptr, N, K,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr):
    """For one (tile, column block): rows [start, end) of the expert-sorted output, all of one expert e,
    C[r, cols] = Σ_kb (qa_kb[src] · W_e,kbᵀ) · sa[src, kb] · sw[e, n, kb] with src = a_row[r] if GATHER else r.
    a: E4M3 [*, K], sa fp32 [*, KB]; w: uint8 [E, N, K/2] packed E2M1; sw: E8M0 codes [E, N, KB]."""
    t = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + t).to(tl.int64)
    start = tl.load(tile_start_ptr + t)
    end = tl.load(tile_end_ptr + t)
    rows = start + tl.arange(0, BLOCK_M).to(tl.int64)
    rm = rows < end
    src = tl.load(a_row_ptr + rows, mask=rm, other=0).to(tl.int64) if GATHER else rows
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cm = cols < N
    half_k = K // 2
    n_kb = tl.cdiv(K, QBLOCK)
    w_rows = expert * N + cols                                            # [BLOCK_N] row of the stacked weights
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(tl.where(end > start, n_kb, 0)):                   # spare tiles skip the loop
        k = kb * QBLOCK + tl.arange(0, QBLOCK)
        a = tl.load(a_ptr + src[:, None] * K + k[None, :], mask=rm[:, None] & (k < K)[None, :], other=0.0)
        j = kb * (QBLOCK // 2) + tl.arange(0, QBLOCK // 2)                  # byte j holds inputs 2j, 2j + 1
        packed = tl.load(w_ptr + w_rows[:, None] * half_k + j[None, :], mask=cm[:, None] & (j < half_k)[None, :],
                         other=0).to(tl.int32)                            # [BLOCK_N, 16]
        w = tl.interleave(e2m1_as_e4m3(packed & 0xF), e2m1_as_e4m3(packed >> 4))   # [BLOCK_N, 32], low nibble first
        w = tl.trans(w.to(tl.uint8).to(tl.float8e4nv, bitcast=True))     # [32, BLOCK_N] = Wᵀ
        sa = tl.load(a_scale_ptr + src * n_kb + kb, mask=rm, other=0.0)
        sw = e8m0_value(tl.load(w_scale_ptr + w_rows * n_kb + kb, mask=cm, other=127))
        acc += tl.dot(a, w) * sa[:, None] * sw[None, :]
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=rm[:, None] & cm[None, :])
