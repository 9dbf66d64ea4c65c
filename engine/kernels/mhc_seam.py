"""Triton kernel for one mHC seam: expand, mixes + Sinkhorn, and collapse, one program per token."""
import triton
import triton.language as tl


@triton.jit
def _sinkhorn(logits, iters, eps):
    """[HC, HC] logits C[a][b] → doubly stochastic; the reference's op order (engine.model.mhc.sinkhorn)."""
    c = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + eps
    c = c / (tl.sum(c, axis=0)[None, :] + eps)
    for _ in range(1, iters):
        c = c / (tl.sum(c, axis=1)[:, None] + eps)
        c = c / (tl.sum(c, axis=0)[None, :] + eps)
    return c


@triton.jit
def mhc_seam_kernel(x_ptr, f_ptr, post_in_ptr, comb_in_ptr, x_out_ptr,
                    fn_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr,
                    carry_ptr, collapsed_ptr,
                    D, iters, hc_eps, norm_eps,
                    HC: tl.constexpr, BLOCK_D: tl.constexpr,
                    EXPAND: tl.constexpr, MIX: tl.constexpr, COLLAPSE: tl.constexpr):
    """Token n's streams X [HC, D]:
    EXPAND:   X ← post_in_b · F + Σ_a comb_in[a][b] · X_a, stored to x_out (then re-read as stored);
    MIX:      pre, post, comb of this site from the flattened X (one RMS over HC·D, Sinkhorn on the HC×HC);
    COLLAPSE: Σ_c carry_c · X_c (the previous site's pre), stored to collapsed [D]."""
    n = tl.program_id(0).to(tl.int64)
    hc = tl.arange(0, HC)
    hc2 = tl.arange(0, HC * HC)
    W = HC * D                                                    # flattened stream width
    if EXPAND:
        post_in = tl.load(post_in_ptr + n * HC + hc)
        comb_in = tl.load(comb_in_ptr + n * HC * HC + hc[:, None] * HC + hc[None, :])   # [a, b]
    if COLLAPSE:
        carry = tl.load(carry_ptr + n * HC + hc)
    acc_pre = tl.zeros([HC], dtype=tl.float32)
    acc_post = tl.zeros([HC], dtype=tl.float32)
    acc_comb = tl.zeros([HC * HC], dtype=tl.float32)
    sumsq = tl.zeros([HC], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        m2 = (hc[:, None] < HC) & dm[None, :]                     # [HC, BLOCK_D]
        x = tl.load(x_ptr + n * W + hc[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
        if EXPAND:
            f = tl.load(f_ptr + n * D + d, mask=dm, other=0.0).to(tl.float32)
            mixed = tl.sum(comb_in[:, :, None] * x[:, None, :], axis=0)   # [a, b, d] summed over source a
            x_new = post_in[:, None] * f[None, :] + mixed
            x_st = x_new.to(x_out_ptr.dtype.element_ty)
            tl.store(x_out_ptr + n * W + hc[:, None] * D + d[None, :], x_st, mask=m2)
            x = x_st.to(tl.float32)                               # the next steps see the stored (rounded) streams
        if MIX:
            sumsq += tl.sum(x * x, axis=1)
            col = hc[None, :, None] * D + d[None, None, :]        # fn column of element (c, d): c·D + d
            m3 = (hc[None, :, None] < HC) & dm[None, None, :]
            fn_pre = tl.load(fn_ptr + hc[:, None, None] * W + col, mask=m3, other=0.0)            # [j, c, d]
            fn_post = tl.load(fn_ptr + (HC + hc[:, None, None]) * W + col, mask=m3, other=0.0)
            fn_comb = tl.load(fn_ptr + (2 * HC + hc2[:, None, None]) * W + col, mask=m3, other=0.0)
            acc_pre += tl.sum(tl.sum(fn_pre * x[None, :, :], axis=2), axis=1)
            acc_post += tl.sum(tl.sum(fn_post * x[None, :, :], axis=2), axis=1)
            acc_comb += tl.sum(tl.sum(fn_comb * x[None, :, :], axis=2), axis=1)
        if COLLAPSE:
            out = tl.sum(carry[:, None] * x, axis=0)
            tl.store(collapsed_ptr + n * D + d, out.to(collapsed_ptr.dtype.element_ty), mask=dm)
    if MIX:
        rms = 1.0 / tl.sqrt(tl.sum(sumsq, axis=0) / W + norm_eps)   # one RMS statistic over all HC·D values
        s0 = tl.load(scale_ptr)
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        pre = tl.sigmoid(acc_pre * rms * s0 + tl.load(base_ptr + hc)) + hc_eps
        post = 2.0 * tl.sigmoid(acc_post * rms * s1 + tl.load(base_ptr + HC + hc))
        logits = acc_comb * rms * s2 + tl.load(base_ptr + 2 * HC + hc2)
        comb = _sinkhorn(tl.reshape(logits, (HC, HC)), iters, hc_eps)
        tl.store(pre_ptr + n * HC + hc, pre)
        tl.store(post_ptr + n * HC + hc, post)
        tl.store(comb_ptr + n * HC * HC + hc[:, None] * HC + hc[None, :], comb)
