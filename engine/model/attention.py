"""Attention (spec §4.3; V4 §11): low-rank q, one shared K=V latent, window ring + compressed rows, sinks, grouped
output."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..spec.config import ModelArgs
from ..spec.roles import LayerRole, family_roles
from .compressor import Compressor
from .context import ForwardContext
from .indexer import Indexer
from .linear import Linear
from .norm import RMSNorm, rms_normalize
from .quant import fp4_qdq, fp8_qdq, v4_kv_qdq
from .rope import Rotary, apply_rope
from .sparse_attn import gather_rows, sparse_attn


def window_index(start: torch.Tensor, n_tokens: int, window: int, slots: int) -> torch.Tensor:
    """[B, S, window] indices into [ring (slots) ; this call's rows (S)] for each query's window
    t−window+1 .. t (−1 before the sequence start). Earlier positions live in ring slot pos % slots."""
    dev = start.device
    t = start.view(-1, 1, 1) + torch.arange(n_tokens, device=dev).view(1, -1, 1)   # [B, S, 1] query positions
    k = t - torch.arange(window, device=dev).view(1, 1, -1)                  # [B, S, window] key positions
    new = k >= start.view(-1, 1, 1)
    idx = torch.where(new, slots + k - start.view(-1, 1, 1), k % slots)
    return torch.where(k >= 0, idx, -1)


def all_visible(visible: torch.Tensor, width: int) -> torch.Tensor:
    """The index list of a layer without an indexer (V4 HCA): every compressed row each query may use.
    visible [B, S] → [B, S, width] (row j, or −1 where j ≥ visible)."""
    j = torch.arange(width, device=visible.device)
    return torch.where(j < visible.unsqueeze(-1), j, -1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, role: LayerRole, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.role, self.layer = role, role.layer
        self.n_heads, self.head_dim, self.rope_dim = args.n_heads, args.head_dim, args.rope_head_dim
        self.groups, self.o_rank = args.o_groups, args.o_lora_rank
        self.window = args.window_size
        self.scale = args.head_dim ** -0.5
        family = family_roles(args)
        self.q_head_norm, self.norm_eps = family.q_head_norm, args.norm_eps
        self.v4_quant = family.v4_quant_sim   # the V4 reference's KV simulation (nope channels FP8, block 64)
        kw = dict(dtype=dtype, device=device)
        self.attn_sink = nn.Parameter(torch.zeros(args.n_heads, dtype=_fp32_or(dtype), device=device))
        self.wq_a = Linear(args.dim, args.q_lora_rank, quantized=True, **kw)
        self.q_norm = RMSNorm(args.q_lora_rank, args.norm_eps, **kw)
        self.wq_b = Linear(args.q_lora_rank, args.n_heads * args.head_dim, quantized=True, **kw)
        self.wkv = Linear(args.dim, args.head_dim, quantized=True, **kw)
        self.kv_norm = RMSNorm(args.head_dim, args.norm_eps, **kw)
        # wo_a is block-diagonal over groups: [groups · o_rank, heads·head_dim / groups], used by einsum
        self.wo_a = Linear(args.n_heads * args.head_dim // args.o_groups, args.o_groups * args.o_lora_rank, **kw)
        self.wo_b = Linear(args.o_groups * args.o_lora_rank, args.dim, quantized=True, **kw)
        self.rotary = Rotary(args.rope_head_dim, role.rope_base, role.yarn, args, device=device)
        if role.kv_mode == "own":
            self.compressor = Compressor(args, role.ratio, role.layer, **kw)
        if role.indexer in ("own", "reindex"):
            self.indexer = Indexer(args, role, **kw)
        self.keys_compressed = role.indexer == "own" and family.key_compressor   # V4 CSA

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x [B, S, dim] (normed collapse of the streams) → [B, S, dim]."""
        B, S, _ = x.shape
        quant = ctx.options.quant_sim
        cache, rows = ctx.cache, ctx.rows_dev
        cis = ctx.cached(("cis", self.rotary.key), lambda: self.rotary.cis(ctx.positions))  # [B, S, rope/2] complex
        q, qr = self.queries(x, cis)                                         # [B, S, H, D], [B, S, q_rank]
        kv = apply_rope(self.kv_norm(self.wkv(x)), cis)                # [B, S, D]
        if quant:
            kv = self.quant_kv(kv)
        ring = cache.window[self.layer]
        slots = ring.size(1)
        win = ctx.cached("window_index", lambda: window_index(ctx.start, S, self.window, slots).to(x.device))
        parts, index = [ring[rows], kv], [win]
        # the newest `slots` rows of this call go into the ring at slot = position % slots
        keep = min(S, slots)
        ring[rows.unsqueeze(1), ctx.positions[:, S - keep:] % slots] = kv[:, S - keep:]
        topk = None
        if self.role.ratio:
            compressed, topk = self._compressed(x, qr, cis, ctx)
            parts.append(compressed)
            index.append(torch.where(topk >= 0, topk + slots + S, -1))
            if ctx.indexer_loss is not None and self.role.indexer in ("own", "reindex"):  # training only
                visible = ctx.visible(cache.ratio[self.role.kv_source])
                ctx.indexer_loss.add(self.layer, q, compressed, self.scale,
                                     self.indexer.dense_scores(x, qr, cis, ctx), visible)
        kv_all, idx = torch.cat(parts, 1), torch.cat(index, -1)
        trace = ctx.trace
        want = trace is not None and trace.wants_attention(f"{self.role.path}.attn")
        res = sparse_attn(q, kv_all, self.attn_sink, idx, self.scale, query_block=ctx.options.attn_query_block,
                          return_probs=want, gather=self.gather_rows)
        o = res[0] if want else res
        if want:
            p, sink_p = res[1].mean(2), res[2].mean(2)                      # averaged over heads
            n_win = self.window
            r_, pos = ctx.trace_rows()
            trace.record_attention(f"{self.role.path}.attn", r_, pos,
                                   topk if topk is not None else idx.new_empty(B, S, 0),
                                   p[..., :n_win].sum(-1), p[..., n_win:].sum(-1), sink_p)
        o = apply_rope(o, cis, inverse=True)                           # strip the query rotation V carries
        o = o.reshape(B, S, self.groups, -1)                                 # [B, S, G, H·D/G], heads grouped in order
        wo_a = self.wo_a.weight.view(self.groups, self.o_rank, -1)          # [G, o_rank, H·D/G]
        z = torch.einsum("bsgd,grd->bsgr", o.to(wo_a.dtype), wo_a)           # [B, S, G, o_rank]
        return self.wo_b(z.flatten(2))

    def gather_rows(self, kv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The rows sparse_attn reads: kv [B, N, D] at idx [B, s, K] → [B, s, K, D] (engine.speedups reads the
        same rows another way)."""
        return gather_rows(kv, idx)

    def queries(self, x: torch.Tensor, cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, dim] → (rotated queries [B, S, H, D], the q-LoRA residual qr [B, S, q_rank] the indexer reads).
        V4 normalises each head (weightless RMS) before the rotation."""
        qr = self.q_norm(self.wq_a(x))                                      # [B, S, q_rank]
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))       # [B, S, H, D]
        if self.q_head_norm:
            q = rms_normalize(q, self.norm_eps)
        return apply_rope(q, cis), qr

    def quant_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """Window KV as the reference caches it: FP8 (block 32) on every channel; V4: on the nope channels."""
        return v4_kv_qdq(kv, self.rope_dim) if self.v4_quant else fp8_qdq(kv)

    def _compressed(self, x, qr, cis, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Publish this call's compressed rows (KV sources), then read the source's rows and the index list."""
        role, cache, rows = self.role, ctx.cache, ctx.rows_dev
        src, ratio = role.kv_source, ctx.cache.ratio[role.kv_source]
        if role.kv_mode == "own":
            latent, group, valid = self.compressor(x, ctx)                   # [B, G, D] pre-RoPE
            # V4: the index keys have a compressor of their own (same groups); it runs on every call for its ring
            key_latent = self.indexer.compressor(x, ctx)[0] if self.keys_compressed else None
            if latent.size(1):
                gcis = self.rotary.cis(group * ratio)              # a group sits at its first token
                scratch = cache.comp_kv[src].size(1) - 1
                dest = torch.where(valid, group, scratch)
                if role.indexer == "own":
                    # V4.1: the indexer keys come from the pre-RoPE latent, before the KV is rotated and quantized
                    # (detached: the index keys get gradient only from the indexer loss, not into the compressor)
                    keys = self.indexer.keys(latent.detach() if key_latent is None else key_latent, gcis,
                                             ctx.options.quant_sim)
                    cache.index_k[src][rows.unsqueeze(1), dest] = keys.to(cache.index_k[src].dtype)
                ckv = apply_rope(latent, gcis)
                if ctx.options.quant_sim:
                    ckv = v4_kv_qdq(ckv, self.rope_dim) if self.v4_quant else fp4_qdq(ckv, 16, "e4m3")
                cache.comp_kv[src][rows.unsqueeze(1), dest] = ckv.to(cache.comp_kv[src].dtype)
        width = ctx.width(ratio)
        topk = self.read_rows(x, qr, cis, ctx, lambda: all_visible(ctx.visible(ratio), width))
        return cache.comp_kv[src][rows, :width], topk

    def read_rows(self, x: torch.Tensor, qr: torch.Tensor, cis: torch.Tensor, ctx: ForwardContext,
                  every_row: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The compressed rows each query reads: its own indexer's top-k (kept for the layers that reuse it), the
        source layer's, or every visible row (V4 HCA: no indexer; every_row() makes them)."""
        role = self.role
        if role.indexer in ("own", "reindex"):
            topk = self.indexer(x, qr, cis, ctx)
            ctx.topk[role.layer] = topk
            return topk
        if role.indexer == "reuse":
            return ctx.topk[role.index_source]
        return every_row()


def _fp32_or(dtype):
    """Tensors the official checkpoint keeps in fp32 stay fp32 unless the model runs in float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32
