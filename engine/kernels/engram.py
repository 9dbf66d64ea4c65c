"""Triton kernels for Engram: hashed row gather, and the per-stream gate with the add into the streams."""
import triton
import triton.language as tl


@triton.jit
def engram_gather_kernel(table_ptr, ids_ptr, out_ptr, COLS, HD,
                         BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[n, c·HD + j] = table[ids[n, c], j]: pure data movement, one token per program."""
    n = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    j = tl.arange(0, BLOCK_H)
    cm = c < COLS
    m = cm[:, None] & (j[None, :] < HD)
    row = tl.load(ids_ptr + n * COLS + c, mask=cm, other=0).to(tl.int64)
    vals = tl.load(table_ptr + row[:, None] * HD + j[None, :], mask=m)
    tl.store(out_ptr + n * COLS * HD + c[:, None] * HD + j[None, :], vals, mask=m)


@triton.jit
def engram_gate_add_kernel(h_ptr, kv_ptr, q_ptr, k_ptr, live_ptr, out_ptr, gate_ptr,
                           D, eps, inv_sqrt_dim,
                           HC: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LIVE: tl.constexpr):
    """Token n: gate_c = σ(signed√(⟨h_c·q_c·k_c, key_c⟩ · rstd(h_c) · rstd(key_c) / √D)), h_c += gate_c · value.
    kv [(HC+1)·D] holds the HC keys then the value. Two passes over D: statistics, then the add."""
    n = tl.program_id(0).to(tl.int64)
    hc = tl.arange(0, HC)
    ss_h = tl.zeros([HC], dtype=tl.float32)
    ss_k = tl.zeros([HC], dtype=tl.float32)
    dot = tl.zeros([HC], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = (hc[:, None] < HC) & (d[None, :] < D)
        at = hc[:, None] * D + d[None, :]
        h = tl.load(h_ptr + n * HC * D + at, mask=m, other=0.0).to(tl.float32)
        key = tl.load(kv_ptr + n * (HC + 1) * D + at, mask=m, other=0.0).to(tl.float32)
        w = (tl.load(q_ptr + at, mask=m, other=0.0).to(tl.float32)
             * tl.load(k_ptr + at, mask=m, other=0.0).to(tl.float32))
        ss_h += tl.sum(h * h, axis=1)
        ss_k += tl.sum(key * key, axis=1)
        dot += tl.sum(h * w * key, axis=1)
    # per (token, stream) normalisation over D, not across the streams
    rstd = (1.0 / tl.sqrt(ss_h / D + eps)) * (1.0 / tl.sqrt(ss_k / D + eps))
    dot = dot * rstd * inv_sqrt_dim
    mag = tl.sqrt(tl.maximum(tl.abs(dot), 1e-6))
    gate = tl.sigmoid(tl.where(dot < 0, -mag, mag))              # signed square root
    if HAS_LIVE:
        gate = tl.where(tl.load(live_ptr + n) != 0, gate, 0.0)
    tl.store(gate_ptr + n * HC + hc, gate)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        m = (hc[:, None] < HC) & dm[None, :]
        at = hc[:, None] * D + d[None, :]
        h = tl.load(h_ptr + n * HC * D + at, mask=m, other=0.0).to(tl.float32)
        value = tl.load(kv_ptr + n * (HC + 1) * D + HC * D + d, mask=dm, other=0.0).to(tl.float32)
        tl.store(out_ptr + n * HC * D + at, (h + gate[:, None] * value[None, :]).to(out_ptr.dtype.element_ty), mask=m)
