"""FastCompressor: a decode step's gated compressor from its pending ring in a few ops (store, or pool one group)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.compressor import Compressor
from ..model.context import ForwardContext
from ..model.norm import upcast
from .derived import derived
from .row_invariant import few_rows_linear
from .sync_free import sync_free_active


class FastCompressor(Compressor):
    """Compressor.forward for the cases a decode step meets (the rest runs the reference code, as do autograd
    and sync_free(), where a CUDA-graph body's static shapes read no value back):

    * ratio 1 (ungated): group = position, every group complete, without the reference's bookkeeping;
    * the call's tokens finish no group (ratio − 1 steps in ratio): the pooling would be empty, so the tokens'
      kv and gate (one fp32 matmul) only go into the pending ring, which is all the reference keeps of the call;
    * one token per row and each row finishes a group: the token joins the ring first, then the group's tokens
      (V4's overlap: and the window before) are read back from it and pooled as the reference pools them.
    The ring holds ratio (+ ratio) + margin tokens, so writing the token first evicts none that are read."""

    def forward(self, x: torch.Tensor, ctx: ForwardContext):
        if torch.is_grad_enabled() and self.wkv.weight.requires_grad:
            return super().forward(x, ctx)
        if not self.gated:  # V4.1 ratio 1: each token is its own group, at its own position, always complete
            return self.norm(self.wkv(x)), ctx.positions, ctx.cached(
                "all_valid", lambda: torch.ones_like(ctx.positions, dtype=torch.bool))
        if sync_free_active():
            return super().forward(x, ctx)
        r, S = self.ratio, ctx.n_tokens
        starts = ctx.cached("starts", ctx.start.tolist)
        done = [(s + S) // r - s // r for s in starts]                       # groups each row finishes now
        if any(done) and not (S == 1 and all(done)):
            return super().forward(x, ctx)
        self._store(x, ctx)
        B, dev = x.size(0), x.device
        if not any(done):
            return (x.new_empty(B, 0, self.head_dim), torch.empty(B, 0, dtype=torch.long, device=dev),
                    torch.empty(B, 0, dtype=torch.bool, device=dev))
        return self._pool_last_group(x, ctx, [s // r == 0 for s in starts])

    def _store(self, x: torch.Tensor, ctx: ForwardContext) -> None:
        """Write the kv and gate of the call's tokens [B, S, W] (fp32) to the pending ring at position % slots."""
        S = ctx.n_tokens
        kv, gate = self.project(upcast(x))                                   # [B, S, W] each
        ring_kv, ring_gate = ctx.cache.pending[self.pending]
        keep = min(S, ring_kv.size(1))
        rows = ctx.rows_dev.unsqueeze(1)
        slots = ctx.positions[:, S - keep:] % ring_kv.size(1)               # [B, keep]
        ring_kv[rows, slots] = kv[:, S - keep:].to(ring_kv.dtype)
        ring_gate[rows, slots] = gate[:, S - keep:].to(ring_gate.dtype)

    def project(self, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Compressor.project as one product with [wkv ; wgate] (its fp32 copy kept once); a few rows (a decode step,
        a verify block, whether or not it finishes a group) in engine.speedups.row_invariant's kernel, each row
        alike at any count."""
        wkv, wgate = self.wkv.weight, self.wgate.weight
        both = derived(self).get("kv_gate", (wkv, wgate), lambda: torch.cat([upcast(wkv), upcast(wgate)]))
        kv_gate = few_rows_linear(xf, both)                                  # [B, S, 2W]: kv, then gate
        if kv_gate is None:
            kv_gate = F.linear(xf, both)
        return kv_gate.split(wkv.size(0), -1)

    def _pool_last_group(self, x: torch.Tensor, ctx: ForwardContext, first_group: list[bool]):
        """One token per row, the last of its group (already in the ring) → (latent [B, 1, head_dim], group [B, 1],
        valid [B, 1]): softmax over the group's tokens of gate (+ ape), per channel, weighting kv."""
        r, n = self.ratio, self.ring_tokens                                  # n = r, or 2r with overlap
        ring_kv, ring_gate = ctx.cache.pending[self.pending]
        P = ring_kv.size(1)
        slots = ctx.cached(("pool_slots", P, n), lambda: (ctx.positions[:, -1:] - n + 1 + torch.arange(
            n, device=ctx.positions.device)) % P)                            # [B, n]: positions t − n + 1 .. t
        rows = ctx.rows_dev.unsqueeze(1)
        g_kv, g_gate = ring_kv[rows, slots], ring_gate[rows, slots]          # [B, n, W]
        if hasattr(self, "ape"):
            ape = upcast(self.ape)                                           # [r, W]: slot j of every window
            g_gate = g_gate + (ape if n == r else torch.cat([ape, ape]))
        if self.overlap:  # the previous window's first half of the channels (Ca), this window's second (Cb)
            d = self.head_dim
            if any(first_group):  # group 0 has no previous window
                none = torch.tensor(first_group, device=x.device).view(-1, 1, 1) & (
                    torch.arange(n, device=x.device) < r).view(1, -1, 1)
                g_gate = g_gate.masked_fill(none, float("-inf"))
            g_kv = torch.cat([g_kv[:, :r, :d], g_kv[:, r:, d:]], 1)          # [B, 2r, d]
            g_gate = torch.cat([g_gate[:, :r, :d], g_gate[:, r:, d:]], 1)
        latent = (g_kv * g_gate.softmax(dim=1)).sum(1, keepdim=True)         # [B, 1, d]
        group = ctx.positions // r                                           # [B, 1]
        return self.norm(latent.to(x.dtype)), group, torch.ones_like(group, dtype=torch.bool)
