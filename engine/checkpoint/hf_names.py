"""V4 tensor names: the Hugging Face transformers `deepseek_v4` modules ↔ the official checkpoint, both ways.

The official names (what this engine's modules are called) are the release's; transformers renames them when it
loads the release (its conversion mapping for "deepseek_v4") and stacks each layer's routed experts:
`ffn.experts.{e}.w1` and `w3` become rows [:inter] and [inter:] of `mlp.experts.gate_up_proj[e]` [E, 2·inter, dim],
`w2` becomes `mlp.experts.down_proj[e]` [E, dim, inter]. transformers has no drafter: `mtp.*` has no HF name.

`save_pretrained` (transformers 5.23, save_original_format=True, its default) reverts that renaming on save, but
not exactly: the names keep the `model.` prefix (`model.layers.0.attn.wq_a.weight`), the anchored top-level rules
stay unreverted (`model.embed_tokens.weight`, `model.hc_head.hc_fn`) and the main attention's `attn.kv_norm`
comes back as `attn.norm` (its `.norm.` → `.kv_norm.` rule reversed). from_hf reads those files too.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .errors import CheckpointError

# whole-model tensors
TOP_LEVEL = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
# inside `layers.{i}.` (official) / `model.layers.{i}.` (HF)
IN_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    **{f"hc_{site}_{p}": f"{site}_hc.{p}" for site in ("attn", "ffn") for p in ("fn", "base", "scale")},
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    # a compressed layer's compressor; a CSA layer's indexer sits inside it on the HF side
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
FROM_HF_TOP = {v: k for k, v in TOP_LEVEL.items()}
SAVED_AS = {"attn.norm.weight": "attn.kv_norm.weight"}   # save_pretrained's spelling → the official one
FROM_HF_IN_LAYER = {v: k for k, v in IN_LAYER.items()}
OFFICIAL_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
OFFICIAL_EXPERT = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight")
HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
HF_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def hf_name(name: str) -> str | None:
    """The HF name of an official tensor that keeps its own tensor (not a routed expert's), else None."""
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    m = OFFICIAL_LAYER.fullmatch(name)
    if m and m[2] in IN_LAYER:
        return f"model.layers.{m[1]}.{IN_LAYER[m[2]]}"
    return None


def official_name(name: str) -> str | None:
    """The official name of an HF tensor that is not a stacked expert tensor (transformers' module name, or the
    name its save_pretrained writes), else None."""
    if name in FROM_HF_TOP:
        return FROM_HF_TOP[name]
    m = HF_LAYER.fullmatch(name)
    if m and m[2] in FROM_HF_IN_LAYER:
        return f"layers.{m[1]}.{FROM_HF_IN_LAYER[m[2]]}"
    if m:  # save_pretrained's reverted form: the official name under `model.`
        suffix = SAVED_AS.get(m[2], m[2])
        if suffix in IN_LAYER or OFFICIAL_EXPERT.fullmatch(f"layers.{m[1]}.{suffix}"):
            return f"layers.{m[1]}.{suffix}"
    return name if name in TOP_LEVEL else None


def to_hf(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official-named tensors (a model's state_dict, a checkpoint) → HF-named ones, experts stacked per layer.
    `mtp.*` (the drafter) is left out: transformers has none. CheckpointError names any other unknown tensor."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    unknown = []
    for name, t in state.items():
        if name.startswith("mtp."):
            continue
        if (m := OFFICIAL_EXPERT.fullmatch(name)) is not None:
            experts.setdefault(int(m[1]), {}).setdefault(int(m[2]), {})[m[3]] = t
        elif (target := hf_name(name)) is not None:
            out[target] = t
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"no transformers deepseek_v4 name for {_few(unknown)}")
    for layer, by_expert in experts.items():
        ids = sorted(by_expert)
        if ids != list(range(len(ids))) or any(set(w) != {"w1", "w2", "w3"} for w in by_expert.values()):
            raise CheckpointError(f"layers.{layer}.ffn.experts: every expert 0..E-1 needs w1, w2 and w3 to stack them")
        prefix = f"model.layers.{layer}.mlp.experts"
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([by_expert[e]["w1"], by_expert[e]["w3"]]) for e in ids])
        out[f"{prefix}.down_proj"] = torch.stack([by_expert[e]["w2"] for e in ids])   # [E, dim, inter]
    return out


def from_hf(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF-named tensors → official-named ones; each layer's stacked experts become views, one per expert and
    projection (no copy). CheckpointError names any tensor the map does not know."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, t in state.items():
        m = HF_LAYER.fullmatch(name)
        if m and m[2] in HF_EXPERTS:
            base = f"layers.{m[1]}.ffn.experts"
            if t.dim() != 3:
                raise CheckpointError(f"'{name}' must be [experts, out, in], got shape {list(t.shape)}")
            if m[2] == HF_EXPERTS[0]:
                if t.size(1) % 2:
                    raise CheckpointError(f"'{name}' stacks w1 over w3, so its rows must be even, got {t.size(1)}")
                inter = t.size(1) // 2
                for e in range(t.size(0)):
                    out[f"{base}.{e}.w1.weight"], out[f"{base}.{e}.w3.weight"] = t[e, :inter], t[e, inter:]
            else:
                for e in range(t.size(0)):
                    out[f"{base}.{e}.w2.weight"] = t[e]
        elif (target := official_name(name)) is not None:
            out[target] = t
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"not a transformers deepseek_v4 tensor this engine knows: {_few(unknown)}")
    return out


def _few(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
