"""The per-layer role table (spec §4.3.3): what each layer computes and whose caches it reads."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ModelArgs


@dataclass(frozen=True)
class LayerRole:
    layer: int               # 0..n_layers-1 for the backbone, n_layers+s for draft stage s
    path: str                # checkpoint prefix: "layers.7" or "mtp.0"
    ratio: int               # KV compression ratio; 0 = window attention only
    rope_base: float
    yarn: bool
    kv_mode: str             # "window" | "own" (compresses and publishes KV) | "reuse" (reads kv_source's)
    kv_source: int | None    # layer whose compressed KV this layer attends
    indexer: str             # "none" | "own" (own keys + query) | "reindex" (own query, source keys) | "reuse"
    index_source: int | None # layer whose top-k index list this layer uses
    index_key_source: int | None  # layer whose index keys score this layer's query
    candidate_source: bool   # builds the block candidate mask for later Reindex layers
    uses_candidates: bool    # restricts its top-k to the candidate source's blocks
    engram: bool
    tapped: bool             # the residual entering this layer feeds the DSpark drafter
    hash_routed: bool        # V4: expert chosen by token id
    draft: bool              # a DSpark / MTP stage
    attn_kind: str           # "SWA", "CSA", "HCA" (V4), or "ratio-2"/"ratio-1" (V4.1)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def summary(self) -> str:
        """A short label, e.g. 'ratio 1 · KV←20 · Reindex (cand.) · Engram'."""
        bits = [self.attn_kind]
        if self.kv_mode == "own":
            bits.append("KV source")
        elif self.kv_mode == "reuse":
            bits.append(f"KV←{self.kv_source}")
        if self.indexer == "reindex":
            bits.append("Reindex" + (" (cand.)" if self.uses_candidates else ""))
        elif self.indexer == "reuse":
            bits.append(f"idx←{self.index_source}")
        if self.candidate_source:
            bits.append("candidate source")
        if self.engram:
            bits.append("Engram")
        if self.hash_routed:
            bits.append("hash-routed")
        if self.tapped:
            bits.append("DSpark tap")
        return " · ".join(bits)


@dataclass(frozen=True)
class FamilyRoles:
    """What differs between the V4 and V4.1 families as a whole (spec §11), and whether a V4.1 config has vision,
    read by the one model code path."""
    single_pass_mhc: bool    # V4.1: a site collapses with the previous site's pre; V4: with its own
    hc_head: bool            # V4: learned final collapse `hc_head_{fn,base,scale}` (and on the last draft stage)
    q_head_norm: bool        # V4: weightless RMS norm of each query head after wq_b
    vision_bias: bool        # V4.1 with a vision tower (vision_n_layers > 0, the reference's vision_enabled):
                             # the router's second selection bias `gate.bias_vl` for image tokens
    markov_names: tuple[str, str]   # the Markov head's (W1, W2) module names in the checkpoint
    overlap_ratio: int       # V4: compressors of this ratio pool two overlapping windows (CSA); 0 = none
    ape: bool                # V4: compressors add a learned per-slot bias `ape` to their gate logits
    key_compressor: bool     # V4: an indexer makes its keys with a compressor of its own (V4.1: from the KV latent)
    v4_quant_sim: bool       # V4's reference simulation: FP8 (block 64) on the nope channels of the window and
                             # compressed KV, Hadamard + FP4 on indexer queries and keys (V4.1: spec §4.3)

    def to_dict(self) -> dict:
        return asdict(self)


def family_roles(a: "ModelArgs") -> FamilyRoles:
    if a.family == "v4":
        return FamilyRoles(single_pass_mhc=False, hc_head=True, q_head_norm=True, vision_bias=False,
                           markov_names=("markov_w1", "markov_w2"), overlap_ratio=4, ape=True, key_compressor=True,
                           v4_quant_sim=True)
    return FamilyRoles(single_pass_mhc=True, hc_head=False, q_head_norm=False, vision_bias=a.vision_enabled,
                       markov_names=("embed", "head"), overlap_ratio=0, ape=False, key_compressor=False,
                       v4_quant_sim=False)


def layer_roles(a: "ModelArgs") -> tuple[LayerRole, ...]:
    roles = []
    last_index_source: int | None = None
    for layer, ratio in enumerate(a.compress_ratios):
        draft = layer >= a.n_layers
        kv_mode, kv_source, indexer, index_source, key_source = "window", None, "none", None, None
        if ratio and a.family == "v4.1":
            kv_source = max(s for s in a.kv_source_layers if s <= layer)
            kv_mode = "own" if kv_source == layer else "reuse"
            if layer in a.index_source_layers:
                indexer = "own" if kv_mode == "own" else "reindex"
                index_source, key_source = layer, kv_source
                last_index_source = layer
            else:
                indexer, index_source, key_source = "reuse", last_index_source, kv_source
        elif ratio:  # V4: every compressed layer owns its compressor; ratio-4 layers own an indexer
            kv_mode, kv_source = "own", layer
            if ratio == 4:
                indexer, index_source, key_source = "own", layer, layer
        uses_candidates = (indexer == "reindex" and a.candidate_source_layer >= 0
                           and key_source == a.candidate_source_layer and layer > a.candidate_source_layer)
        if a.family == "v4":
            attn_kind = {0: "SWA", 4: "CSA"}.get(ratio, "HCA")
        else:
            attn_kind = f"ratio-{ratio}" if ratio else "SWA"
        roles.append(LayerRole(
            layer=layer, path=f"mtp.{layer - a.n_layers}" if draft else f"layers.{layer}",
            ratio=ratio, rope_base=a.compress_rope_theta if ratio else a.rope_theta,
            yarn=bool(ratio) and a.original_seq_len > 0, kv_mode=kv_mode, kv_source=kv_source,
            indexer=indexer, index_source=index_source, index_key_source=key_source,
            candidate_source=layer == a.candidate_source_layer, uses_candidates=uses_candidates,
            engram=layer in a.engram_layer_ids and not draft,
            tapped=layer in a.dspark_target_layer_ids and not draft,
            hash_routed=layer < a.n_hash_layers, draft=draft, attn_kind=attn_kind))
    return tuple(roles)
