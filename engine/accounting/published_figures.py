"""Published V4.1-Flash / V4-Flash figures beside the exact counts, with the reason for each difference."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .accounting import GIB, account

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

# Where the published numbers come from: V4.1-Flash's model card and tech report (§4.2.1), the vLLM recipe's
# memory table and spec §2.1/§5; V4-Flash's model card (284B total, 13B activated) and DSpark diagram page.


@dataclass(frozen=True)
class Figure:
    label: str
    exact: float
    published: float
    unit: str          # "params", "GiB" or "B" (bytes)
    why: str

    @property
    def difference(self) -> float:
        return self.exact - self.published

    def to_dict(self) -> dict:
        return {**asdict(self), "difference": self.difference}

    def fmt(self, value: float) -> str:
        if self.unit == "params":
            return f"{value / 1e9:.3f}B" if abs(value) >= 1e8 else f"{value / 1e6:.2f}M"
        if self.unit == "GiB":
            return f"{value:.2f} GiB"
        return f"{value:g} B"


def is_v41_flash(a: "ModelArgs") -> bool:
    return a.family == "v4.1" and (a.dim, a.n_layers, a.n_routed_experts) == (5120, 40, 384)


def is_v4_flash(a: "ModelArgs") -> bool:
    return a.family == "v4" and (a.dim, a.n_layers, a.n_routed_experts) == (4096, 43, 256)


def published_figures(args: "ModelArgs") -> list[Figure]:
    """Rows (label, exact, published, difference, why); empty for configs with no published figures."""
    if is_v41_flash(args):
        return _v41(args)
    if is_v4_flash(args):
        return _v4(args)
    return []


def _v41(a: "ModelArgs") -> list[Figure]:
    acc = account(a)
    p, b = acc.params_by_kind, acc.bytes_by_kind
    routed, shared, backbone = p["routed_experts"], p["shared_experts"], acc.backbone_params
    rest = backbone - routed - shared
    attn = p["attention"] + p["compressor"] + p["indexer"]
    # the same count with layers 0..19 ('the bottom 20 layers'), i.e. without the boundary layer 20
    first20 = acc.activated_prefill - acc.layers[acc.prefill_layers[1]].activated
    drafter_experts = a.n_draft_stages * a.draft_n_routed_experts
    fp4_payload = (a.n_layers * a.n_routed_experts + drafter_experts) * a.dim * a.moe_inter_dim * 3 // 2
    vision_doc = b["vision"] / GIB
    return [
        Figure("backbone parameters", backbone, 552e9, "params",
               "backbone = all weights except the Engram tables, the DSpark drafter and vision; it includes "
               "embedding + head and the Engram projections. The published figure is rounded."),
        Figure("routed experts", routed, 543.6e9, "params", f"{a.n_layers} layers x {a.n_routed_experts} experts x "
               f"3·{a.dim}·{a.moe_inter_dim}; rounding only"),
        Figure("shared experts", shared, 1.4e9, "params", f"{a.n_layers} x 3·{a.dim}·{a.moe_inter_dim}; rounding only"),
        Figure("everything else in the backbone", rest, 6.9e9, "params",
               f"attention incl. compressors/indexers {attn / 1e9:.2f}B + embedding and head "
               f"{(p['embedding'] + p['head']) / 1e9:.2f}B + Engram projections {p['engram_projections'] / 1e9:.2f}B "
               f"+ routers {p['router'] / 1e9:.2f}B + mHC {p['mhc'] / 1e9:.3f}B + norms; vision is not in it"),
        Figure("parameters per routed expert", acc.expert_params, 35.4e6, "params", "3 x 5120 x 2304; rounding only"),
        Figure("Engram table parameters", p["engram_tables"], 196.6e9, "params",
               "sum of engram_num_embeddings x 256 channels; rounding only"),
        Figure("Engram tables in FP8", b["engram_tables"] / GIB, 188.8, "GiB",
               "256 FP8 bytes + 8 E8M0 scale bytes per row; rounding only"),
        Figure("activated per decode token", acc.activated_decode, 16e9, "params",
               "7 experts per layer (6 routed + shared) + attention, mHC, routers, Engram projections and the "
               "LM head; embedding and Engram tables are gathers and the drafter is off. The published '16B' "
               "does not state what it includes."),
        Figure("activated per prefill token", acc.activated_prefill, 8e9, "params",
               f"CED bounded replay: an average prompt token runs layers 0-{acc.prefill_layers[1]} (layer 20 "
               f"builds the decoder KV for every token); layers 0-19 alone give {first20 / 1e9:.2f}B; no LM head. "
               f"Exact reference prefill (every layer for every token) is {acc.activated_prefill_exact / 1e9:.2f}B."),
        Figure("checkpoint size", acc.checkpoint_bytes / GIB, 476, "GiB",
               f"exact sum over the non-vision tensors (backbone, Engram, drafter). Vision is not fully "
               f"listed: its documented tensors add {vision_doc:.2f} GiB and the rest of the 266 vision/"
               "aligner tensors (output projections, MLP w2, norms, patch embedding) is not published; "
               "shard headers add a few MiB."),
        Figure("routed expert bytes", fp4_payload / GIB, 259.5, "GiB",
               f"reproduced as the FP4 payload (half a byte per weight) of all "
               f"{a.n_layers * a.n_routed_experts + drafter_experts} routed experts, backbone + drafter, without "
               f"their E8M0 scales; with scales the backbone's experts alone are {b['routed_experts'] / GIB:.2f} GiB"),
        Figure("global KV bytes per token", acc.kv_global_per_token, 890, "B",
               "3 ratio-2 sources x (288 + 68)/2 + the ratio-1 source's 288 + 68; exact"),
    ]


def _v4(a: "ModelArgs") -> list[Figure]:
    acc = account(a)
    drafter = acc.params_by_kind["drafter"]
    label = "DSpark drafter" if a.has_dspark else "MTP layer"
    return [
        Figure("total parameters", acc.backbone_params, 284e9, "params",
               f"the published total excludes the {label} ({drafter / 1e9:.2f}B); with it the checkpoint holds "
               f"{acc.total_params / 1e9:.2f}B. It includes embedding and head; hash-routing tables are not "
               "parameters."),
        Figure("activated per token", acc.activated_decode, 13e9, "params",
               "7 experts per layer + attention (with compressors/indexers), mHC, routers and the LM head; "
               "embedding excluded (gather). The published figure is rounded."),
    ]

