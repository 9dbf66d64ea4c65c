"""Kernel-backed variants of Block, Gate, MoE and Engram: same parameters and trace calls, Triton launches inside."""
from __future__ import annotations

import torch

from ..kernels import launch
from ..model.block import Block
from ..model.draft import DraftStage
from ..model.engram import Engram
from ..model.moe import Gate, MoE
from .fast_moe import FastMoE


def _reference_needed(*tensors: torch.Tensor) -> bool:
    """Autograd (training) and float64 take the PyTorch path: the kernels have no backward and compute in fp32."""
    if any(t.dtype == torch.float64 for t in tensors):
        return True
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class KernelBlock(Block):
    """Block.forward with each mHC seam in one launch: entry (mixes + collapse), middle (expand + mixes +
    collapse) and exit (expand); attention and the MoE stay modules (the MoE has its own kernels)."""

    def _site(self, site: str):
        return dict(fn=getattr(self, f"hc_{site}_fn"), scale=getattr(self, f"hc_{site}_scale"),
                    base=getattr(self, f"hc_{site}_base"), iters=self.iters, hc_eps=self.hc_eps, norm_eps=self.norm_eps)

    def _record(self, ctx, site, pre, post, comb) -> None:
        if ctx.trace is not None:
            rows, pos = ctx.trace_rows()
            ctx.trace.record_mhc(self.path, site, rows, pos, pre, post, comb)   # the trace derives the residuals

    def forward(self, x: torch.Tensor, pre_in: torch.Tensor, ctx):
        # the seams carry V4.1's shifted pre; an mhc-identity intervention here takes the reference, which pins comb
        if (_reference_needed(x, self.hc_attn_fn) or not self.single_pass
                or ctx.interventions.names("mhc-identity", self.role.layer)):
            return super().forward(x, pre_in, ctx)
        _, a_pre, a_post, a_comb, c = launch.mhc_seam(x, carry=pre_in, **self._site("attn"))
        self._record(ctx, "attn", a_pre, a_post, a_comb)
        f = self.attn(self.attn_norm(c), ctx)
        x, f_pre, f_post, f_comb, c = launch.mhc_seam(x, f=f, post_in=a_post, comb_in=a_comb, carry=a_pre,
                                                      **self._site("ffn"))
        self._record(ctx, "ffn", f_pre, f_post, f_comb)
        f = self.moe(self.ffn_norm(c), ctx)
        x, *_ = launch.mhc_seam(x, f=f, post_in=f_post, comb_in=f_comb)
        return x, f_pre


class KernelDraftStage(DraftStage, KernelBlock):
    """A DSpark drafter stage (its extra heads untouched) whose block forward is KernelBlock's."""


class KernelGate(Gate):
    """The router in one launch: scores, selection bias, top-k, renormalisation and scale."""

    def forward(self, x: torch.Tensor, vision: torch.Tensor | None = None, steer: torch.Tensor | None = None):
        if steer is not None or _reference_needed(x, self.weight):  # interventions take the PyTorch router
            return super().forward(x, vision, steer)
        return launch.route(x, self.weight, self.bias, topk=self.topk, temp=self.temp, route_scale=self.route_scale,
                            normalize=self.norm_topk, bias_vl=None if vision is None else self.bias_vl, vision=vision)


class KernelMoE(FastMoE):
    """MoE.forward (its gate a KernelGate) with the routed experts as three launches over expert-sorted tiles,
    any token count, no host sync; FastMoE's paths where the kernels do not apply. Decode calls go through
    routed_experts too (the reference forward), not FastMoE's gathered shortcut."""

    forward = MoE.forward

    def routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if _reference_needed(x, self.gate.weight):
            return super().routed_experts(x, weights, ids)
        w1, w2, w3 = self.stacked()
        return launch.moe_experts(x, weights, ids, w1, w2, w3, limit=self.limit, act_quant=self.experts[0].w1.act_quant)


class KernelEngram(Engram):
    """Row gather and gate-and-add as kernels; the wkv projection between them stays a (cuBLAS) linear."""

    def forward(self, h: torch.Tensor, row_ids: torch.Tensor, live: torch.Tensor | None):
        # a host-resident table (engine.quant) gathers its own rows: there is no device table to index
        if getattr(self.embed, "host_resident", False) or _reference_needed(h, self.embed.weight):
            return super().forward(h, row_ids, live)
        table = self.embed.weight
        rows = launch.engram_gather(table, row_ids.to(table.device))         # [B, S, cols·head_dim]
        kv = self.wkv(rows.to(device=h.device, dtype=h.dtype))                # [B, S, (hc+1)·dim]
        return launch.engram_gate_add(h, kv, self.q_weight, self.k_weight, eps=self.eps,
                                      live=None if live is None else live.to(h.device))
