"""Launchers of the FP8 / FP4 GEMM kernels: check the official-format inputs, allocate, pick blocks, launch."""
from __future__ import annotations

import torch

from .runtime import KERNEL_DTYPES, KernelInputError, block, check, compiled_for, require

QBLOCK = 32                                     # activation blocks, FP8 weight scale blocks, FP4 scale groups
FP8 = (torch.float8_e4m3fn,)
E8M0 = (torch.float8_e8m0fnu,)
F32 = (torch.float32,)


def _blocks_for(device: torch.device, m: int, n: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): on a GPU tiles that fit registers; under the interpreter (numpy, one program
    after another) wide tiles, so that fewer programs run."""
    if device.type == "cpu":
        return block(m, 64, 16), block(n, 256, 16)
    return block(m, 64, 16), block(n, 128, 32)


def act_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp32/bf16/fp16) → (q float8_e4m3fn [M, K], s float32 [M, ceil(K/32)]) with x ≈ q · s per row and
    32-wide block: s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(x / s) (ties to even). A partial last
    block counts its missing columns as zeros. Bit-identical to engine.model.quant.fp8_qdq's arithmetic."""
    require(x.device)
    dev = x.device
    x = check(x, "x", shape=(None, None), dtypes=KERNEL_DTYPES, device=dev)
    M, K = x.shape
    n_kb = -(-K // QBLOCK)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=dev)
    s = torch.empty(M, n_kb, dtype=torch.float32, device=dev)
    if M and K:
        # triton is optional (the gpu extra): the kernel module loads only when launched
        from .fp8_gemm import act_quant_kernel

        tile = 256 if dev.type == "cpu" else 16                           # K blocks of 32 per program
        bg = block(n_kb, tile)
        br = block(M, tile // bg)                                         # rows per program, when K is short
        compiled_for(act_quant_kernel, dev)[(-(-M // br), -(-n_kb // bg))](x, q, s, M, K, BLOCK_R=br, BLOCK_G=bg)
    return q, s


def _check_activation(q: torch.Tensor, s: torch.Tensor, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    q = check(q, "q", shape=(None, None), dtypes=FP8, device=dev)
    s = check(s, "s", shape=(q.size(0), -(-q.size(1) // QBLOCK)), dtypes=F32, device=dev)
    return q, s


def fp8_gemm(q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Quantized activations (q [M, K] E4M3, s [M, ceil(K/32)] fp32, from act_quant) times an official FP8
    weight (weight [N, K] E4M3, weight_scale [ceil(N/32), ceil(K/32)] E8M0) → [M, N] in out_dtype:
    C = Σ_kb (q_kb · w_kbᵀ) · s[m, kb] · weight_scale[n // 32, kb], accumulated in fp32."""
    require(q.device)
    dev = q.device
    q, s = _check_activation(q, s, dev)
    M, K = q.shape
    weight = check(weight, "weight", shape=(None, K), dtypes=FP8, device=dev)
    N = weight.size(0)
    weight_scale = check(weight_scale, "weight_scale", shape=(-(-N // QBLOCK), -(-K // QBLOCK)), dtypes=E8M0,
                         device=dev)
    if out_dtype not in KERNEL_DTYPES:
        raise KernelInputError(f"out_dtype {out_dtype} is not one of {', '.join(map(str, KERNEL_DTYPES))}")
    out = torch.empty(M, N, dtype=out_dtype, device=dev)
    if M and N:
        # triton is optional (the gpu extra): the kernel module loads only when launched
        from .fp8_gemm import fp8_gemm_kernel

        bm, bn = _blocks_for(dev, M, N)
        compiled_for(fp8_gemm_kernel, dev)[(-(-M // bm), -(-N // bn))](
            q, s, weight, weight_scale.view(torch.uint8), out, M, N, K, BLOCK_M=bm, BLOCK_N=bn)
    return out


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The reference's FP8 linear: x [..., K] → [..., N] in x.dtype, with x quantized to FP8 per 32-wide block
    (act_quant) and multiplied by the FP8 weight block by block (fp8_gemm)."""
    lead = x.shape[:-1]
    q, s = act_quant(x.reshape(-1, x.size(-1)))                           # [tokens, K]
    return fp8_gemm(q, s, weight, weight_scale, x.dtype).reshape(*lead, weight.size(0))


def fp4_expert_gemm(q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    tile_expert: torch.Tensor, tile_start: torch.Tensor, tile_end: torch.Tensor, *,
                    rows: torch.Tensor | None = None, n_rows: int | None = None, block_m: int = 16,
                    out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Grouped GEMM over routed experts with MXFP4 weights. Output row r (expert-sorted, tiles from
    engine.kernels.launch.expert_tiles) = FP8 activation row src (src = rows[r] if rows is given, else r) times
    expert e's weight: weight [E, N, K/2] int8 (two E2M1 per byte, low nibble = input 2j), weight_scale
    [E, N, ceil(K/32)] E8M0. q [*, K] E4M3 and s fp32 as from act_quant. block_m: the tile height the tiles
    were cut with (a power of two ≥ 16; 64 lets a GPU use its FP8 wgmma). Returns [n_rows, N] in out_dtype
    (n_rows defaults to rows' length, else q's)."""
    require(q.device)
    dev = q.device
    q, s = _check_activation(q, s, dev)
    K = q.size(1)
    if K % 2:
        raise KernelInputError(f"MXFP4 weights pack two inputs per byte: K must be even, got {K}")
    weight = check(weight, "weight", shape=(None, None, K // 2), dtypes=(torch.int8, torch.uint8), device=dev)
    E, N = weight.shape[:2]
    weight_scale = check(weight_scale, "weight_scale", shape=(E, N, -(-K // QBLOCK)), dtypes=E8M0, device=dev)
    tile_expert = check(tile_expert, "tile_expert", shape=(None,), dtypes=(torch.int64,), device=dev)
    tile_start = check(tile_start, "tile_start", shape=tile_expert.shape, dtypes=(torch.int64,), device=dev)
    tile_end = check(tile_end, "tile_end", shape=tile_expert.shape, dtypes=(torch.int64,), device=dev)
    if rows is not None:
        rows = check(rows, "rows", shape=(None,), dtypes=(torch.int64, torch.int32), device=dev)
    if n_rows is None:
        n_rows = rows.numel() if rows is not None else q.size(0)
    if out_dtype not in KERNEL_DTYPES:
        raise KernelInputError(f"out_dtype {out_dtype} is not one of {', '.join(map(str, KERNEL_DTYPES))}")
    if block_m < 16 or block_m & (block_m - 1):
        raise KernelInputError(f"block_m must be a power of two ≥ 16 (tl.dot's smallest tile), got {block_m}")
    out = torch.zeros(n_rows, N, dtype=out_dtype, device=dev)
    if n_rows and N and tile_expert.numel():
        # triton is optional (the gpu extra): the kernel module loads only when launched
        from .fp4_gemm import fp4_expert_gemm_kernel

        bn = _blocks_for(dev, block_m, N)[1]
        compiled_for(fp4_expert_gemm_kernel, dev)[(tile_expert.numel(), -(-N // bn))](
            q, s, rows if rows is not None else tile_start, weight.view(torch.uint8), weight_scale.view(torch.uint8),
            out, tile_expert, tile_start, tile_end, N, K, BLOCK_M=block_m, BLOCK_N=bn, GATHER=rows is not None)
    return out


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """One MXFP4 expert matrix as a linear: x [..., K] → [..., N] in x.dtype (weight [N, K/2] int8, weight_scale
    [N, ceil(K/32)] E8M0), with the FP8 activation quantization first: the grouped kernel with one expert."""
    lead = x.shape[:-1]
    q, s = act_quant(x.reshape(-1, x.size(-1)))                           # [tokens, K]
    M, dev = q.size(0), q.device
    block_m = block(M, 64, 16)
    starts = torch.arange(0, M, block_m, device=dev)                      # tiles of block_m rows, all expert 0
    ends = torch.clamp(starts + block_m, max=M)
    out = fp4_expert_gemm(q, s, weight.unsqueeze(0), weight_scale.unsqueeze(0), torch.zeros_like(starts),
                          starts, ends, block_m=block_m, out_dtype=x.dtype)
    return out.reshape(*lead, weight.size(0))
