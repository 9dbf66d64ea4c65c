"""ModelArgs: one frozen, validated description of a DeepSeek-V4-family model (no torch import)."""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from . import strict_json
from .config_values import coerce
from .engram_layout import EngramLayout
from .errors import ConfigError
from .hf_config import is_hf_v4, release_form
from .limits import JSON_MAX_DEPTH
from .roles import layer_roles
from .strict_json import read_capped
from .validation import validate


@dataclass(frozen=True)
class ModelArgs:
    """Field names are the reference `inference/config.json` keys; HF names map here via ALIASES."""
    # sizes
    vocab_size: int = 129280
    dim: int = 0
    moe_inter_dim: int = 0
    n_layers: int = 0
    n_mtp_layers: int = 0
    n_heads: int = 0
    head_dim: int = 512
    rope_head_dim: int = 64
    q_lora_rank: int = 0
    o_groups: int = 1
    o_lora_rank: int = 0
    # MoE
    n_routed_experts: int = 0
    n_shared_experts: int = 1
    n_activated_experts: int = 1
    n_hash_layers: int = 0
    score_func: str = "sqrtsoftplus"
    route_scale: float = 1.0
    swiglu_limit: float = 0.0
    norm_topk_prob: bool = True
    gate_temp: float = 1.0
    norm_eps: float = 1e-6
    # attention, compression and RoPE
    window_size: int = 128
    compress_ratios: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 1.0
    original_seq_len: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    kv_source_layers: tuple[int, ...] = ()
    index_source_layers: tuple[int, ...] = ()
    index_n_heads: int = 0
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_source_layer: int = -1
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    # mHC
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    # Engram
    engram_layer_ids: tuple[int, ...] = ()
    engram_vocab_size: int = 0
    engram_num_embeddings: tuple[int, ...] = ()
    engram_max_ngram_size: int = 4
    engram_pad_id: int = 2
    engram_compressed_vocab_size: int = 0
    engram_n_heads: int = 0
    engram_head_dim: int = 0
    # DSpark
    dspark_block_size: int = 0
    dspark_noise_token_id: int = -1
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 0
    dspark_n_routed_experts: int = 0
    dspark_n_activated_experts: int = 0
    # storage formats
    dtype: str = "bf16"
    expert_dtype: str = ""
    scale_fmt: str = "ue8m0"
    weight_block_size: tuple[int, ...] = (32, 32)
    # vision tower (described, not run)
    vision_n_layers: int = 0
    vision_dim: int = 0
    vision_n_heads: int = 0
    vision_inter_dim: int = 0
    vision_patch_size: int = 14
    vision_downsample_ratio: int = 1
    vision_max_n_token: int = 0
    vision_min_pixels: int = 0
    vision_max_wh_ratio: float | None = None
    vision_rope_theta: float = 10000.0
    image_token_id: int = -1
    # special tokens and runtime limits
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    max_seq_len: int = 4096
    max_batch_size: int = 4
    max_position_embeddings: int = 0
    # identity (not architecture)
    model_type: str = ""
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        validate(self)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def family(self) -> str:
        """'v4.1' (shared KV sources, Engram) or 'v4' (per-layer CSA/HCA, hash routing, hc_head)."""
        if self.model_type:
            return "v4.1" if "v41" in self.model_type else "v4"
        return "v4.1" if self.kv_source_layers else "v4"

    @property
    def n_draft_stages(self) -> int:
        """Layers after the backbone in `compress_ratios`: DSpark stages, or the plain MTP layers. V4.1 counts them
        as its reference does, `n_mtp_layers` (`num_nextn_predict_layers`), whatever the number of tapped layers:
        the taps set only stage 0's main_proj input width (spec §7). The V4 DSpark revision's config keeps the plain
        V4's `num_nextn_predict_layers` (1) and lists one draft layer per tap in `compress_ratios` (spec §1.3)."""
        if self.has_dspark and self.family == "v4":
            return len(self.dspark_target_layer_ids)
        return self.n_mtp_layers

    @property
    def has_dspark(self) -> bool:
        return self.dspark_block_size > 0

    @property
    def vision_enabled(self) -> bool:
        """Whether the config has a vision tower (the reference's `vision_enabled`): only then does a V4.1 router
        hold `gate.bias_vl`, the selection bias of image tokens."""
        return self.vision_n_layers > 0

    @property
    def has_engram(self) -> bool:
        return bool(self.engram_layer_ids)

    @property
    def hc_dim(self) -> int:
        """Flattened width of the mHC residual: streams × dim."""
        return self.hc_mult * self.dim

    @property
    def hc_mix_dim(self) -> int:
        """mHC mix outputs per site: hc pre + hc post + hc×hc matrix."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def draft_n_routed_experts(self) -> int:
        return self.dspark_n_routed_experts or self.n_routed_experts

    @property
    def draft_n_activated_experts(self) -> int:
        return self.dspark_n_activated_experts or self.n_activated_experts

    @property
    def engram_n_columns(self) -> int:
        """Hashed rows gathered per token per Engram layer: (max n-gram − 1) × heads."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    @property
    def engram_layout(self) -> EngramLayout:
        """The Engram hash tables' primes, offsets and multipliers (spec §4.4.2)."""
        return EngramLayout(self.engram_layer_ids, self.engram_vocab_size, self.engram_max_ngram_size,
                            self.engram_n_heads, self.engram_compressed_vocab_size)

    @cached_property
    def roles(self):
        """One LayerRole per backbone layer, then one per draft stage (spec §4.3.3)."""
        return layer_roles(self)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in fields(self)}

    def replace(self, **changes: Any) -> "ModelArgs":
        return dataclasses.replace(self, **changes)

    def without_drafter(self) -> "ModelArgs":
        """The backbone alone, with no draft stage (DSpark or MTP): the config of a checkpoint that holds no
        `mtp.*` weights although its config lists draft layers (transformers saves none)."""
        dspark = {f.name: f.default for f in fields(self) if f.name.startswith("dspark_")}
        return self.replace(n_mtp_layers=0, compress_ratios=self.compress_ratios[: self.n_layers], **dspark)


# ---- loading ---------------------------------------------------------------------------------

# HF name -> ModelArgs field. A value of None marks a key that is known and carries no architecture.
ALIASES: dict[str, str | None] = {
    "hidden_size": "dim", "moe_intermediate_size": "moe_inter_dim", "num_hidden_layers": "n_layers",
    "num_nextn_predict_layers": "n_mtp_layers", "num_attention_heads": "n_heads",
    "num_experts_per_tok": "n_activated_experts", "dspark_num_experts_per_tok": "dspark_n_activated_experts",
    "num_hash_layers": "n_hash_layers", "scoring_func": "score_func", "routed_scaling_factor": "route_scale",
    "qk_rope_head_dim": "rope_head_dim", "rms_norm_eps": "norm_eps", "sliding_window": "window_size",
    "kv_source_layer_ids": "kv_source_layers", "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer", "engram_pad_token_id": "engram_pad_id",
    "original_max_position_embeddings": "original_seq_len", "factor": "rope_factor",
    "quant_method": "dtype", "max_image_tokens": "vision_max_n_token",
    # vision_config (prefixed with "vision." by the loader)
    "vision.num_hidden_layers": "vision_n_layers", "vision.hidden_size": "vision_dim",
    "vision.num_attention_heads": "vision_n_heads", "vision.intermediate_size": "vision_inter_dim",
    "vision.patch_size": "vision_patch_size", "vision.rope_theta": "vision_rope_theta",
    "vision.downsample_ratio": "vision_downsample_ratio", "vision.max_image_tokens": "vision_max_n_token",
    "vision.min_pixels": "vision_min_pixels", "vision.max_wh_ratio": "vision_max_wh_ratio",
    "vision.model_type": None,
    # known keys without architectural content
    "architectures": None, "transformers_version": None, "torch_dtype": None, "attention_bias": None,
    "attention_dropout": None, "initializer_range": None, "use_cache": None, "hidden_act": None,
    "num_key_value_heads": None, "topk_method": None, "tie_word_embeddings": None, "rope_type": None,
    "type": None, "activation_scheme": None, "fmt": None, "auto_map": None, "_name_or_path": None,
}
# Values that a known-but-unmodelled key must have: anything else is an architecture we do not run.
REQUIRED_VALUES = {"hidden_act": "silu", "num_key_value_heads": 1, "tie_word_embeddings": False,
                   "attention_bias": False, "scoring_func": "sqrtsoftplus", "score_func": "sqrtsoftplus"}
NESTED = {"rope_scaling", "quantization_config"}
REQUIRED = ("dim", "moe_inter_dim", "n_layers", "n_heads", "q_lora_rank", "o_lora_rank",
            "n_routed_experts", "compress_ratios")
FIELD_TYPES = {f.name: f.type for f in fields(ModelArgs)}


def load_config(path: str | Path) -> ModelArgs:
    """Read a config.json (HF composite, HF flat, or reference inference form) into ModelArgs. Reads at most
    CONFIG_MAX_BYTES + 1 bytes; every problem is a ConfigError starting with the path."""
    path = Path(path)
    try:
        data = read_capped(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
    return config_from_text(data, name=path.parent.name if path.name == "config.json" else path.stem,
                            source=str(path))


def config_from_text(data: str | bytes, name: str = "", source: str = "") -> ModelArgs:
    """The one entry for config text (a file's contents, an upload): JSON text or UTF-8 bytes → ModelArgs.
    Refused with ConfigError, prefixed by `source` (a path or file name): more than CONFIG_MAX_BYTES, invalid
    UTF-8 or JSON, duplicate keys, deep nesting, and everything config_from_dict refuses."""
    try:
        return config_from_dict(strict_json.loads(data), name=name)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}" if source else str(e)) from None


def config_from_dict(raw: Any, name: str = "") -> ModelArgs:
    """A parsed config (any of the three forms) → ModelArgs; ConfigError names the key and the problem."""
    if not isinstance(raw, dict):
        raise ConfigError(f"top level must be a JSON object, got {_json_kind(raw)}")
    if strict_json.nesting_depth(raw) > JSON_MAX_DEPTH:  # a dict built in Python skipped strict_json.loads
        raise ConfigError(f"objects or lists nest more than {JSON_MAX_DEPTH} levels deep")
    if is_hf_v4(raw):  # transformers 5 writes V4 configs in its own keys (layer_types, rope_parameters, ...)
        raw = release_form(raw)
    values, origin = _flatten(raw)
    if not values.get("model_type") and "architectures" in raw:
        values["model_type"] = _model_type_from(raw["architectures"])
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        hf = {v: k for k, v in ALIASES.items() if v in missing and "." not in k}
        names = [f"{k} ({hf[k]})" if k in hf else k for k in missing]
        hint = ""
        if "text_config" not in raw and {"vision_config", "architectures", "quantization_config"} & raw.keys():
            hint = ("; this looks like the HF composite form, which keeps the text model's keys in a "
                    "'text_config' object, and it has none")
        raise ConfigError("missing required key(s): " + ", ".join(names) + hint)
    try:
        return ModelArgs(name=name, **{key: coerce(key, FIELD_TYPES[key], value) for key, value in values.items()})
    except ConfigError as e:  # name the key as the file spells it when that differs ('factor' in ...rope_scaling)
        key = str(e).partition("'")[2].partition("'")[0].partition("[")[0]
        raise ConfigError(f"{e} (from {origin[key]})" if key in origin else str(e)) from None


def _model_type_from(architectures: Any) -> str:
    """model_type of a config that names only its `architectures` (a list of class names)."""
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ConfigError(f"'architectures' must be a list of class names, got {strict_json.shown(architectures)}")
    return "deepseek_v41" if "v41" in " ".join(architectures).lower() else "deepseek_v4"


def _flatten(raw: dict) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge text_config/vision_config/rope_scaling/quantization_config into one field dict; also return, per
    field, where its value came from ('hidden_size in text_config') for messages."""
    is_hf = bool({"text_config", "hidden_size", "vision_config", "transformers_version"} & raw.keys())
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def take(key: str, value: Any, where: str) -> None:
        shown_key = strict_json.shown_key(key)
        if key in NESTED:
            if value is None:  # HF writes "rope_scaling": null for no scaling
                return
            if not isinstance(value, dict):
                raise ConfigError(f"'{key}' in {where} must be an object, got {_json_kind(value)}")
            for k, v in value.items():
                take(k, v, f"{where}.{key}")
            return
        if key == "dtype" and is_hf and not where.endswith("quantization_config"):
            return  # HF's "dtype" is the activation torch dtype, not the weight storage format
        if key in REQUIRED_VALUES and (type(value) is not type(REQUIRED_VALUES[key]) or value != REQUIRED_VALUES[key]):
            shown = repr(value[:60]) if isinstance(value, str) else strict_json.shown(value)
            raise ConfigError(f"'{key}' in {where} is {shown}; only {REQUIRED_VALUES[key]!r} is supported")
        if key == "model_type" and isinstance(value, str):
            value = value.removesuffix("_text")  # HF composite: "deepseek_v41" outside, "..._text" inside
        target = ALIASES.get(key, key) if key in ALIASES else key
        if target is None:
            return
        if target == "name":  # ModelArgs.name is the file's (or folder's) name, never a key of the file
            raise ConfigError(f"'{shown_key}' in {where} is not a config key: a config's name is its file name "
                              "(or, for config.json, its folder's name)")
        if target not in FIELD_TYPES:
            keys = [k for k in [*FIELD_TYPES, *ALIASES] if k != "name"]
            hint = difflib.get_close_matches(str(key)[:100], keys, n=1)
            raise ConfigError(f"unknown key '{shown_key}' in {where}"
                              + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        if target in out and out[target] != value:
            raise ConfigError(f"'{shown_key}' in {where} conflicts with an earlier value for '{target}'")
        out[target] = value
        if key != target or where != "config":
            origin[target] = f"'{shown_key}' in {where}"

    for key, value in raw.items():
        if key in ("text_config", "vision_config"):
            if not isinstance(value, dict):
                raise ConfigError(f"'{key}' must be an object, got {_json_kind(value)}")
            for k, v in value.items():
                if key == "vision_config":
                    target = ALIASES.get(f"vision.{k}", f"vision_{k}")
                    if target is None:
                        continue
                    if target not in FIELD_TYPES:
                        raise ConfigError(f"unknown key '{strict_json.shown_key(k)}' in vision_config")
                    out[target] = v
                    origin[target] = f"'{strict_json.shown_key(k)}' in vision_config"
                else:
                    take(k, v, "text_config")
        else:
            take(key, value, "config")
    return out, origin


def _json_kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    return {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
