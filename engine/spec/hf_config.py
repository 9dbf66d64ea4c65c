"""A transformers 5 `DeepseekV4Config` (config.json of `save_pretrained`) in the release's flat form (no torch).

transformers folds the release's per-layer keys into its own on load and writes those back: `layer_types` +
`compress_rates` (for `compress_ratios`), `mlp_layer_types` (for `num_hash_layers`), `rope_parameters` {main,
compress} (for rope_theta / compress_rope_theta / rope_scaling) and `partial_rotary_factor` (for
`qk_rope_head_dim`). This turns them back, so engine.spec.config reads either file the same way.
"""
from __future__ import annotations

from typing import Any

from .errors import ConfigError

CSA_RATE = 4   # the ratio that makes a V4 compressed layer CSA (engine.spec.roles, FamilyRoles.overlap_ratio)
LAYER_TYPE_DEFAULT_RATES = {"compressed_sparse_attention": CSA_RATE, "heavily_compressed_attention": 128}
# transformers-only keys without architecture, or folded back below
HF_ONLY_KEYS = ("layer_types", "compress_rates", "mlp_layer_types", "rope_parameters", "partial_rotary_factor",
                "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "mlp_bias", "dtype",
                "pad_token_id", "rope_scaling")
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")


def is_hf_v4(raw: dict) -> bool:
    """A transformers 5 V4 config: it names its layer types instead of listing compress ratios."""
    return raw.get("model_type") == "deepseek_v4" and "layer_types" in raw and "compress_ratios" not in raw


def release_form(raw: dict) -> dict[str, Any]:
    """The flat release form of a transformers 5 V4 config; ConfigError names a key it cannot translate."""
    out = {k: v for k, v in raw.items() if k not in HF_ONLY_KEYS}
    n = _int(raw, "num_hidden_layers")
    rates = {**LAYER_TYPE_DEFAULT_RATES, **_dict(raw, "compress_rates", {})}
    _check_rates(rates)
    ratio_of = {"sliding_attention": 0, **rates}
    types = raw["layer_types"]
    if not isinstance(types, list) or len(types) != n or any(t not in ratio_of for t in types):
        raise ConfigError(f"'layer_types' must list one of {sorted(ratio_of)} per layer ({n}), got "
                          f"{str(types)[:120]}")
    out["compress_ratios"] = [ratio_of[t] for t in types] + [0] * int(raw.get("num_nextn_predict_layers") or 0)
    mlp = raw.get("mlp_layer_types") or ["moe"] * n
    n_hash = next((i for i, t in enumerate(mlp) if t != "hash_moe"), len(mlp)) if isinstance(mlp, list) else 0
    if not isinstance(mlp, list) or len(mlp) != n or any(t != "moe" for t in mlp[n_hash:]):
        raise ConfigError(f"'mlp_layer_types' must be 'hash_moe' for the first layers and 'moe' after them, one per "
                          f"layer ({n}), got {str(mlp)[:120]}")
    out["num_hash_layers"] = n_hash
    rope = _dict(raw, "rope_parameters", {})
    main, compress = _dict(rope, "main", {}), _dict(rope, "compress", {})
    for key, src in (("rope_theta", main), ("compress_rope_theta", compress)):
        if "rope_theta" in src:
            out[key] = src["rope_theta"]
    if compress.get("rope_type", compress.get("type")) == "yarn":
        if compress.get("attention_factor", 1.0) != 1.0:
            raise ConfigError(f"'rope_parameters.compress.attention_factor' is {compress['attention_factor']}; the "
                              "V4 attention does not scale by a YaRN mscale, only 1.0 is supported")
        out["rope_scaling"] = {"type": "yarn", **{k: compress[k] for k in YARN_KEYS if k in compress}}
    if "qk_rope_head_dim" not in out and raw.get("partial_rotary_factor") is not None:
        out["qk_rope_head_dim"] = int(_int(raw, "head_dim") * raw["partial_rotary_factor"])
    return out


def _check_rates(rates: dict) -> None:
    """The engine (as DeepSeek's reference) tells the V4 attentions apart by the ratio alone: a compressed layer of
    ratio 4 is CSA (overlapping windows, its own indexer), any other ratio HCA. A CSA rate other than 4, or an HCA
    rate of 4, would build the other attention and fail at load on its tensors: refused here, naming the rate."""
    csa, hca = rates.get("compressed_sparse_attention"), rates.get("heavily_compressed_attention")
    if csa != CSA_RATE:
        raise ConfigError(f"'compress_rates' sets compressed_sparse_attention to {str(csa)[:40]}; this engine runs "
                          f"CSA at ratio {CSA_RATE} only (the release's rate)")
    if type(hca) is not int or hca <= 0 or hca == CSA_RATE:
        raise ConfigError(f"'compress_rates' sets heavily_compressed_attention to {str(hca)[:40]}; this engine runs "
                          f"HCA at a positive ratio other than {CSA_RATE} (the release's: 128), since ratio "
                          f"{CSA_RATE} means CSA")


def _int(raw: dict, key: str) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConfigError(f"'{key}' must be an integer, got {str(v)[:40]}")
    return v


def _dict(raw: dict, key: str, default: dict) -> dict:
    v = raw.get(key, default)
    if v is None:
        return default
    if not isinstance(v, dict):
        raise ConfigError(f"'{key}' must be an object, got {str(v)[:60]}")
    return v
