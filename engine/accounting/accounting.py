"""Exact parameter, byte and KV-cache accounting from ModelArgs and the tensor inventory (no torch)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import ceil
from typing import TYPE_CHECKING

from ..spec.errors import InputError
from .inventory import DRAFT_NOTE, VISION_NOTE, TensorSpec, inventory_tuple

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

GIB = 2**30

# Module kinds in reporting order; `kind_of` maps a tensor name to one of them.
KINDS = ("routed_experts", "shared_experts", "router", "attention", "compressor", "indexer", "mhc", "norms",
         "embedding", "head", "engram_tables", "engram_projections", "drafter", "vision")

ACTIVATED_RULES = (
    "activated = weights multiplied per token: each layer's attention (incl. its compressor/indexer), "
    "mHC, norms, router, shared expert and top-k routed experts, Engram projections, final norm.",
    "not activated: the embedding and Engram tables (row gathers, not matmuls), the other routed experts, "
    "the drafter (runs only with speculative decoding), vision.",
    "decode: all backbone layers + the LM head (one token's logits).",
    "prefill: the LM head is excluded (logits only for the last prompt position).",
)


def kind_of(name: str) -> str:
    if name.startswith("layers.") and ".ffn.experts." in name:  # fast path: ~95% of all tensors
        return "routed_experts"
    if name.startswith(("vision.", "aligner.", "image_")):
        return "vision"
    if name.startswith("mtp."):
        return "drafter"
    if name == "embed.weight":
        return "embedding"
    if name == "head.weight":
        return "head"
    if ".engram.embed." in name:
        return "engram_tables"
    if ".engram." in name:
        return "engram_projections"
    if ".ffn.experts." in name:
        return "routed_experts"
    if ".ffn.shared_experts." in name:
        return "shared_experts"
    if ".ffn.gate." in name:
        return "router"
    if ".attn.compressor." in name:
        return "compressor"
    if ".attn.indexer." in name:
        return "indexer"
    if ".attn." in name:
        return "attention"
    if "hc_" in name:
        return "mhc"
    return "norms"


def layer_prefix(name: str) -> str | None:
    """'layers.7' / 'mtp.1' for a tensor inside a layer or draft stage, else None."""
    head, _, rest = name.partition(".")
    if head in ("layers", "mtp"):
        return f"{head}.{rest.partition('.')[0]}"
    return None


@dataclass(frozen=True)
class LayerAccount:
    index: int            # position in args.roles (backbone layers, then draft stages)
    path: str
    role: str             # LayerRole.summary
    params: int
    nbytes: int
    routed_params: int
    activated: int        # per-token activated params of this layer (see ACTIVATED_RULES)
    kv_window: float      # bytes per token in this layer's window ring
    kv_compressed: float  # bytes per token of compressed KV this layer publishes
    kv_index: float       # bytes per token of index keys this layer publishes
    by_kind: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Accounting:
    model: str
    family: str
    n_tensors: int
    params_by_kind: dict
    bytes_by_kind: dict
    bytes_by_dtype: dict
    layers: tuple
    expert_params: int            # one routed backbone expert
    activated_decode: int
    activated_prefill: int        # with the CED bounded replay (spec §5); equals exact when no CED
    activated_prefill_exact: int  # reference semantics: every prompt token runs every layer
    prefill_layers: tuple         # (first, last) layer an average prompt token runs under the replay
    notes: tuple

    # ---- headline sums ---------------------------------------------------------------------
    @property
    def total_params(self) -> int:
        """Everything in the non-vision checkpoint: backbone, Engram tables, drafter."""
        return sum(v for k, v in self.params_by_kind.items() if k != "vision")

    @property
    def backbone_params(self) -> int:
        """The model without Engram tables, drafter and vision (what a '552B' figure counts)."""
        return self.total_params - self.params_by_kind["engram_tables"] - self.params_by_kind["drafter"]

    @property
    def checkpoint_bytes(self) -> int:
        return sum(v for k, v in self.bytes_by_kind.items() if k != "vision")

    @property
    def kv_global_per_token(self) -> float:
        """Compressed KV + index-key bytes per token (the part that grows with context)."""
        return sum(l.kv_compressed + l.kv_index for l in self.layers)

    @property
    def kv_window_per_token(self) -> float:
        """Window-ring bytes per token summed over layers (held for at most window_size tokens)."""
        return sum(l.kv_window for l in self.layers)

    def to_json(self) -> dict:
        p, b = self.params_by_kind, self.bytes_by_kind
        return {
            "model": self.model, "family": self.family, "n_tensors": self.n_tensors,
            "params": {
                "total": self.total_params, "backbone": self.backbone_params,
                "routed_experts": p["routed_experts"], "shared_experts": p["shared_experts"],
                "per_expert": self.expert_params, "engram": p["engram_tables"],
                "engram_projections": p["engram_projections"], "dspark": p["drafter"],
                "vision_documented": p["vision"],
                "activated_decode": self.activated_decode, "activated_prefill": self.activated_prefill,
                "activated_prefill_exact": self.activated_prefill_exact,
                "prefill_layers": list(self.prefill_layers), "by_kind": dict(p),
            },
            "bytes": {
                "checkpoint": self.checkpoint_bytes, "routed_experts": b["routed_experts"],
                "engram": b["engram_tables"], "dspark": b["drafter"], "by_kind": dict(b),
                "by_dtype": dict(self.bytes_by_dtype),
            },
            "kv_bytes_per_token": {
                "global": self.kv_global_per_token, "window_per_token_all_layers": self.kv_window_per_token,
                "layers": [{"layer": l.path, "window": l.kv_window, "compressed": l.kv_compressed,
                            "index_keys": l.kv_index} for l in self.layers],
            },
            "layers": [{"index": l.index, "path": l.path, "role": l.role, "params": l.params,
                        "bytes": l.nbytes, "routed_params": l.routed_params, "activated": l.activated,
                        "by_kind": dict(l.by_kind)} for l in self.layers],
            "assumptions": list(ACTIVATED_RULES), "notes": list(self.notes),
        }


# ---- KV-cache byte budget (spec §5) ------------------------------------------------------------
def window_bytes(a: "ModelArgs") -> int:
    """FP8 window row plus one E8M0 scale per 32 channels (512 + 16 = 528 B for head_dim 512)."""
    return a.head_dim + ceil(a.head_dim / 32)


def compressed_kv_bytes(a: "ModelArgs") -> int:
    """FP4 compressed row: two values per byte plus one E4M3 scale per 16 (256 + 32 = 288 B)."""
    return a.head_dim // 2 + ceil(a.head_dim / 16)


def index_key_bytes(a: "ModelArgs") -> int:
    """FP4 index key: two values per byte plus one E8M0 scale per 32 (64 + 4 = 68 B)."""
    return a.index_head_dim // 2 + ceil(a.index_head_dim / 32)


def _kv_for(a: "ModelArgs", role) -> tuple[float, float, float]:
    comp = idx = 0.0
    if role.ratio and role.kv_mode == "own":
        comp = compressed_kv_bytes(a) / role.ratio
        # V4.1 KV sources publish the index keys; in V4 every ratio-4 layer owns an indexer
        if role.indexer == "own":
            idx = index_key_bytes(a) / role.ratio
    return float(window_bytes(a)), comp, idx


# ---- the account ---------------------------------------------------------------------------------
def _sum(tensors) -> tuple[int, int]:
    params = nbytes = 0
    for t in tensors:
        params += t.params
        nbytes += t.nbytes
    return params, nbytes


def account(args: "ModelArgs") -> Accounting:
    """The exact account of a config (cached per args; equal configs share one result)."""
    acc = _account(args)
    return acc if acc.model == args.name else replace(acc, model=args.name)


@lru_cache(maxsize=8)
def _account(args: "ModelArgs") -> Accounting:
    a = args
    inv = inventory_tuple(a, include_vision=True)
    params_by_kind = dict.fromkeys(KINDS, 0)
    bytes_by_kind = dict.fromkeys(KINDS, 0)
    bytes_by_dtype: dict[str, int] = defaultdict(int)
    per_layer: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # path -> (params, bytes, kind)
    n_vision = 0
    for t in inv:
        k, nb = kind_of(t.name), t.nbytes
        params_by_kind[k] += t.params
        bytes_by_kind[k] += nb
        if k == "vision":
            n_vision += 1
        else:
            bytes_by_dtype[t.dtype] += nb
        if (lp := layer_prefix(t.name)) is not None:
            per_layer[lp].append((t.params, nb, _draft_kind(t.name) if k == "drafter" else k))

    expert_params = 3 * a.dim * a.moe_inter_dim
    layers = []
    for role in a.roles:
        tensors = per_layer[role.path]
        by_kind: dict[str, int] = defaultdict(int)
        params = nbytes = 0
        for tp, nb, k in tensors:
            by_kind[k] += tp
            params += tp
            nbytes += nb
        routed = by_kind.get("routed_experts", 0)
        gathered = by_kind.get("engram_tables", 0)
        top_k = a.draft_n_activated_experts if role.draft and a.has_dspark else a.n_activated_experts
        activated = params - routed - gathered + top_k * expert_params
        layers.append(LayerAccount(role.layer, role.path, role.summary, params, nbytes, routed, activated,
                                   *_kv_for(a, role), by_kind=dict(by_kind)))

    backbone = [l for l in layers if not l.path.startswith("mtp.")]
    final = _sum([t for t in inv if t.name == "norm.weight"])[0]
    head = params_by_kind["head"]
    decode = sum(l.activated for l in backbone) + final + head
    exact_prefill = decode - head
    last = _replay_boundary(a)
    replay = sum(l.activated for l in backbone[: last + 1]) + final
    notes = [
        f"prefill with CED bounded replay: an average prompt token runs layers 0-{last}; layers "
        f"{last + 1}-{a.n_layers - 1} run only on the last <= {a.window_size} prompt tokens (spec §5)"
        if last < a.n_layers - 1 else "no CED boundary: every prompt token runs every layer",
    ]
    if a.vision_n_layers:
        notes.append(VISION_NOTE)
    if a.family == "v4":
        notes.append("V4 gate.tid2eid is an integer routing table: counted in bytes, not in parameters")
        notes.append("KV bytes for V4 apply the V4.1 cache formats to the V4 layout (V4's own are not in the spec)")
        if a.has_dspark:
            notes.append(DRAFT_NOTE)
    return Accounting(
        model=a.name, family=a.family, n_tensors=len(inv) - n_vision,
        params_by_kind=params_by_kind, bytes_by_kind=bytes_by_kind, bytes_by_dtype=dict(bytes_by_dtype),
        layers=tuple(layers), expert_params=expert_params, activated_decode=decode,
        activated_prefill=replay, activated_prefill_exact=exact_prefill, prefill_layers=(0, last),
        notes=tuple(notes))


def _draft_kind(name: str) -> str:
    """Inside a draft stage, classify like a backbone layer so its experts are counted as experts;
    the drafter's own projections and heads (main_proj, e/h_proj, markov/confidence heads) stay 'drafter'."""
    kind = kind_of("layers." + name.partition(".")[2])
    if kind == "norms" and not name.endswith("norm.weight"):
        return "drafter"
    return kind


def _replay_boundary(a: "ModelArgs") -> int:
    """Last layer run over every prompt token under bounded replay: the last KV source (V4.1's layer 20)."""
    if a.family == "v4.1" and a.kv_source_layers:
        return a.kv_source_layers[-1]
    return a.n_layers - 1


# ---- helpers for the diagram ---------------------------------------------------------------------
@lru_cache(maxsize=4096)
def module_params(args: "ModelArgs", prefix: str) -> tuple[int, int]:
    """(params, bytes) of tensors named `prefix.*`; an mHC site 'layers.3.hc_attn' finds its `_fn/_base/_scale`."""
    if not prefix:
        raise InputError("module_params needs a non-empty prefix such as 'layers.3.attn'")
    # Only mHC parameters hang off a name with "_" (layers.3.hc_attn_fn); elsewhere "_" would also match
    # siblings such as layers.3.attn_norm for layers.3.attn.
    dotted = prefix + "."
    under = prefix + "_" if prefix.rsplit(".", 1)[-1].startswith("hc_") else dotted
    lp = layer_prefix(prefix)
    pool = _prefix_index(args).get(lp, ()) if lp and lp.split(".")[1].isdigit() \
        else inventory_tuple(args, include_vision=True)
    return _sum([t for t in pool if t.name.startswith(dotted) or t.name.startswith(under) or t.name == prefix])


@lru_cache(maxsize=4)
def _prefix_index(args: "ModelArgs") -> dict[str, tuple[TensorSpec, ...]]:
    """Tensors grouped by layer path, so a prefix inside one layer scans that layer only."""
    groups: dict[str, list[TensorSpec]] = defaultdict(list)
    for t in inventory_tuple(args, include_vision=True):
        if (lp := layer_prefix(t.name)) is not None:
            groups[lp].append(t)
    return {k: tuple(v) for k, v in groups.items()}
