"""Triton kernels for FP8 linears (spec §3.2, §3.4): dynamic FP8 activation quantization per row and 32-wide
K block, and the block-scaled FP8 × FP8 GEMM with E8M0 [32, 32] weight scales, fp32 accumulation.

Rounding to E4M3 is done with integer arithmetic (`e4m3_round`), not by the hardware conversion: the
interpreter's fp32 → fp8 conversion neither rounds ties to even nor keeps subnormals, and exact values
convert the same everywhere. E8M0 scales arrive as uint8 codes (Triton has no E8M0 pointer type)."""
import triton
import triton.language as tl

QBLOCK = tl.constexpr(32)         # activation quantization block and weight scale block along K (and N)


@triton.jit
def e8m0_value(code):
    """E8M0 codes (any integer type) → fp32 2^(code − 127); code 0 is 2^-127 (a subnormal), 255 is NaN."""
    c = code.to(tl.int32) & 0xFF
    bits = tl.where(c == 0, 0x00400000, c << 23)
    bits = tl.where(c == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def pow2_ceil_scale(amax):
    """2^ceil(log2(amax · fp32(1/448))) by the reference's IEEE trick (exponent + (mantissa ≠ 0)); returns
    (scale, 1/scale), both exact powers of two."""
    bits = (amax * (1.0 / 448.0)).to(tl.int32, bitcast=True)
    log2_ceil = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    scale = ((log2_ceil + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - log2_ceil) << 23).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def e4m3_round(v):
    """fp32 → the nearest E4M3 value as fp32: ties to even, saturating at ±448, −0 kept. Each binade has 8
    steps of 2^(e−3); below 2^-6 the subnormal grid continues in steps of 2^-9."""
    negative = v.to(tl.int32, bitcast=True) < 0
    a = tl.minimum(tl.abs(v), 448.0)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    t = a * ((127 - (e - 3)) << 23).to(tl.float32, bitcast=True)         # a / step exactly: t in [0, 16)
    i = t.to(tl.int32)                                                   # truncation = floor (t ≥ 0)
    frac = t - i.to(tl.float32)
    i += ((frac > 0.5) | ((frac == 0.5) & ((i & 1) == 1))).to(tl.int32)
    r = i.to(tl.float32) * step
    return tl.where(negative, -r, r)


@triton.jit
def act_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr):
    """BLOCK_R rows × BLOCK_G K blocks of 32, one block per tile row: s[m, g] = 2^ceil(log2(max(amax,
    1e-4) / 448)) and q[m, 32g:32g+32] = e4m3(x / s)."""
    n_kb = tl.cdiv(K, QBLOCK)
    i = tl.arange(0, BLOCK_R * BLOCK_G)
    m = tl.program_id(0).to(tl.int64) * BLOCK_R + i // BLOCK_G           # [R·G] row of each tile row
    g = tl.program_id(1) * BLOCK_G + i % BLOCK_G                         # [R·G] its K block
    live = (m < M) & (g < n_kb)
    k = g[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]                # [R·G, 32]
    mask = live[:, None] & (k < K)
    x = tl.load(x_ptr + m[:, None] * K + k, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)                   # [R·G]
    scale, inverse = pow2_ceil_scale(amax)
    q = e4m3_round(x * inverse[:, None])
    tl.store(q_ptr + m[:, None] * K + k, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + m * n_kb + g, scale, mask=live)


@triton.jit
def fp8_gemm_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """C[rows, cols] = Σ_kb (qa_kb · qw_kbᵀ) · sa[m, kb] · sw[n // 32, kb]: one FP8 dot per 32-wide K block,
    rescaled and summed in fp32, stored in C's dtype. a: E4M3 [M, K], sa fp32 [M, KB]; w: E4M3 [N, K],
    sw: E8M0 codes [ceil(N/32), KB]."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm, cm = rows < M, cols < N
    n_kb = tl.cdiv(K, QBLOCK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(n_kb):
        k = kb * QBLOCK + tl.arange(0, QBLOCK)
        km = k < K
        a = tl.load(a_ptr + rows[:, None] * K + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + k[:, None], mask=km[:, None] & cm[None, :], other=0.0)  # [32, N] = Wᵀ
        sa = tl.load(a_scale_ptr + rows * n_kb + kb, mask=rm, other=0.0)
        sw = e8m0_value(tl.load(w_scale_ptr + (cols // QBLOCK) * n_kb + kb, mask=cm, other=127))
        acc += tl.dot(a, w) * sa[:, None] * sw[None, :]
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=rm[:, None] & cm[None, :])
