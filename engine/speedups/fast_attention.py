"""FastAttention: Attention.forward for decode and verify calls in far fewer ops; same cache writes and results."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.attention import Attention
from ..model.context import ForwardContext
from .call_values import call_rows, call_width, every_visible_row, own_positions, ring_slots
from .casts import cast
from .cpu_bf16 import copy_made, fp32_copy, through_fp32_copy
from .derived import derived
from .fast_indexer import FastIndexer
from .fast_linear import FastLinear
from .fast_quant import fp4_qdq, fp8_qdq, v4_kv_qdq
from .fast_rope import MAX_ROTATED_POSITIONS, inverse_rotation, rotate, rotation, rotation_at, scaled_rotation
from .row_invariant import few_rows_linear
from .sparse_rows import selected_rows
from .window_attention import ring_hidden, window_attention


class FastAttention(Attention):
    """For a call of a few tokens per row (decode, a DSpark verify block): RoPE as one matmul per tensor
    (engine.speedups.fast_rope), FP8 KV rounding in half the ops, the new KV written into the window ring first
    and attention read from the ring in place (masked, no gather; engine.speedups.window_attention), the
    grouped output projection as one batched matmul over the groups; the compressed path with the fast rounding
    and rotations (_fast_compressed) and the fast compressor and indexer. A trace that asks for this layer's
    attention facts gets them from the same computation (so a trace never changes the logits). Static shapes
    (CUDA graphs, torch.compile) take the same path: it reads no value back and sizes nothing by one. Autograd, long
    prefills and the indexer loss run the reference code, which reads its rows in one index_select
    (engine.speedups.sparse_rows)."""

    def gather_rows(self, kv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return selected_rows(kv, idx)

    def fast_path_applies(self, x: torch.Tensor, ctx: ForwardContext) -> bool:
        B, S, _ = x.shape
        if torch.is_grad_enabled() and (x.requires_grad or self.wkv.weight.requires_grad):
            return False
        if ctx.indexer_loss is not None or B * S > MAX_ROTATED_POSITIONS:
            return False
        # this call's writes must not evict a slot a query of it still reads: S ≤ the ring's spare slots + 1
        return S <= ctx.cache.window_slots - self.window + 1

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if not self.fast_path_applies(x, ctx):
            return super().forward(x, ctx)
        B, S, _ = x.shape
        rot = rotation(ctx, self.rotary, self.head_dim)                      # [B, S, D, D]
        q_low, kv = self._input_projections(x)                                # [B, S, q_rank], [B, S, D]
        qr = self.q_norm(q_low)                                             # [B, S, q_rank]
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))       # [B, S, H, D]
        if self.q_head_norm:
            q = F.rms_norm(q, (self.head_dim,), None, self.norm_eps)
        math_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        q = rotate(q, scaled_rotation(ctx, self.rotary, self.head_dim, self.scale, math_dtype))   # q·scale, rotated
        kv = rotate(self.kv_norm(kv), rot)                                   # [B, S, D]
        if ctx.options.quant_sim:
            kv = v4_kv_qdq(kv, self.rope_dim) if self.v4_quant else fp8_qdq(kv)
        ring = ctx.cache.window[self.layer]                                  # [rows, slots, D]
        slots = ring.size(1)
        ring[ring_slots(ctx, slots)] = kv                                    # slot = position % slots
        hidden = ring_hidden(ctx, slots, self.window)                        # [B, S, 1, slots]
        compressed = topk = None
        if self.role.ratio:
            compressed, topk = self._fast_compressed(x, qr, rot, ctx)
        trace = ctx.trace
        path = f"{self.role.path}.attn"
        if trace is not None and trace.wants_attention(path):
            o, window_mass, compressed_mass, sink_mass = window_attention(
                q, call_rows(ctx, ring), hidden, self.attn_sink, compressed, topk, return_mass=True)
            r_, pos = ctx.trace_rows()
            trace.record_attention(path, r_, pos, topk if topk is not None else torch.empty(
                B, S, 0, dtype=torch.long, device=x.device), window_mass, compressed_mass, sink_mass)
        else:
            o = window_attention(q, call_rows(ctx, ring), hidden, self.attn_sink, compressed, topk)
        o = rotate(o, inverse_rotation(ctx, self.rotary, self.head_dim))     # strip the query rotation V carries
        return self.grouped_output(o)

    def grouped_output(self, o: torch.Tensor) -> torch.Tensor:
        """The grouped output projection wo_b(wo_a per head group) of o [B, S, H, D] → [B, S, dim], as one batched
        matmul with the groups as its batch: the weight is read in place (a matmul broadcasting it over B·S would
        first copy it once per token). A small bf16 weight on the CPU is read from an fp32 copy (cpu_bf16)."""
        B, S = o.shape[:2]
        G, w = self.groups, self.wo_a.weight
        if through_fp32_copy(B * S, w) and copy_made(self, "wo_a:fp32"):
            wo_a = fp32_copy(self, "wo_a:fp32", w, self._by_groups)                  # [G, H·D/G, r]
        else:
            wo_a = derived(self).get("wo_a", (w,), lambda: self._by_groups(w))
        by_group = cast(cast(o.reshape(B * S, G, -1).transpose(0, 1), w.dtype), wo_a.dtype)  # [G, B·S, H·D/G]
        per_group = [few_rows_linear(by_group[g], w_g) for g, w_g in enumerate(w.view(G, self.o_rank, -1))]
        if all(z is not None for z in per_group):   # a few rows: each alike at any count (row_invariant)
            z = cast(torch.stack(per_group), w.dtype)                        # [G, B·S, r]
        else:
            z = cast(torch.bmm(by_group, wo_a), w.dtype)                     # [G, B·S, r]
        return self.wo_b(z.transpose(0, 1).reshape(B, S, G * self.o_rank))

    def _by_groups(self, wo_a: torch.Tensor) -> torch.Tensor:
        """wo_a [G·r, H·D/G] as [G, H·D/G, r] (a view)."""
        return wo_a.view(self.groups, self.o_rank, -1).transpose(1, 2)

    def _input_projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """wq_a(x) and wkv(x); when both FP8-round their input (act_quant), x is rounded once for the two."""
        a, b = self.wq_a, self.wkv
        if (type(a) is FastLinear and type(b) is FastLinear and a.act_quant and a.quantized and b.act_quant
                and b.quantized and a.weight.dtype == b.weight.dtype):
            xq = cast(fp8_qdq(x), a.weight.dtype)
            return tuple(F.linear(xq, w) if y is None else y                 # a few rows: row_invariant's kernel
                         for w in (a.weight, b.weight) for y in [few_rows_linear(xq, w)])
        return a(x), b(x)

    def _fast_compressed(self, x: torch.Tensor, qr: torch.Tensor, rot: torch.Tensor, ctx: ForwardContext):
        """Attention._compressed with the fast rounding and, at ratio 1 (each token its own group, rotated at its
        own position), the call's rotation matrix instead of a second RoPE; the source's rows for one cache row
        are a view, not a copy."""
        role, cache = self.role, ctx.cache
        src, ratio = role.kv_source, cache.ratio[role.kv_source]
        cis = ctx.cached(("cis", self.rotary.key), lambda: self.rotary.cis(ctx.positions))
        if role.kv_mode == "own":
            latent, group, valid = self.compressor(x, ctx)                   # [B, G, D] pre-RoPE
            key_latent = self.indexer.compressor(x, ctx)[0] if self.keys_compressed else None
            if latent.size(1):
                same = ratio == 1 and latent.size(1) == x.size(1)            # groups = this call's tokens, all valid
                dest = own_positions(ctx) if same else (
                    ctx.rows_dev.unsqueeze(1), torch.where(valid, group, cache.comp_kv[src].size(1) - 1))

                def at_groups(width: int) -> torch.Tensor:  # a group is rotated at its first token's position
                    return rotation(ctx, self.rotary, width) if same else rotation_at(ctx, self.rotary,
                                                                                      group * ratio, width)
                if role.indexer == "own":
                    k_in = latent if key_latent is None else key_latent
                    if isinstance(self.indexer, FastIndexer):
                        keys = self.indexer.rotated_keys(k_in, at_groups(self.indexer.head_dim), ctx.options.quant_sim)
                    else:
                        keys = self.indexer.keys(k_in, cis if same else self.rotary.cis(group * ratio),
                                                 ctx.options.quant_sim)
                    cache.index_k[src][dest] = cast(keys, cache.index_k[src].dtype)
                ckv = rotate(latent, rot if same else at_groups(self.head_dim))
                if ctx.options.quant_sim:
                    ckv = v4_kv_qdq(ckv, self.rope_dim) if self.v4_quant else fp4_qdq(ckv, 16, "e4m3")
                cache.comp_kv[src][dest] = cast(ckv, cache.comp_kv[src].dtype)
        width = call_width(ctx, ratio)
        topk = self.read_rows(x, qr, cis, ctx, lambda: every_visible_row(ctx, ratio, width))
        return call_rows(ctx, cache.comp_kv[src])[:, :width], topk

