"""The steps an opened attention or MoE box shows: which ones a layer's role has, where they sit, the tensors each
computes with, the engine code that does it, and the shapes on the arrows between them."""
from __future__ import annotations

from dataclasses import dataclass

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole, family_roles

from .shapes import Shapes

OPENABLE = {"attention": "attn", "moe": "ffn"}   # graph type of an openable box → its name in the URL's `open`


@dataclass(frozen=True)
class Step:
    id: str              # a module path: the graph's node for a checkpoint module ('layers.20.attn.indexer'),
                         # else the parent's path + the step's name ('layers.20.attn.q_lora')
    parent: str          # 'layers.20.attn'
    name: str            # 'q_lora'
    kind: str            # colour family (diagram KIND_STYLE)
    title: str
    subtitle: str
    lane: int            # column inside the opened box; lane 0 is the layer's flow column
    row: int
    span: int = 1        # lanes a wide box covers
    owns: tuple[str, ...] = ()    # the parent's checkpoint modules this step computes with ('wq_a', 'q_norm', ...)
    code: tuple[str, ...] = ()    # the engine functions / classes / methods that do it
    module: bool = False          # a checkpoint module of its own (a graph node, with its own details)
    reads: str = ""               # a Reuse step: the other layer's module whose output it reads
    inputs: tuple[tuple[str, str], ...] = ()    # (what, shape)
    outputs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StepEdge:
    a: str               # a step name, or "in": the opened box's input
    b: str               # a step name, or "out": the opened box's output
    label: str           # the shape it carries
    route: str = "down"  # down (straight, where the boxes overlap) | diag | bypass (around the right) | elbow


def attention_steps(a: ModelArgs, role: LayerRole) -> tuple[list[Step], list[StepEdge]]:
    """The steps of one attention module, only those its role has (spec §4.3; V4 §11)."""
    p, s, fam = f"{role.path}.attn", Shapes(a), family_roles(a)
    q_chain = "wq_a → q_norm → wq_b" + (" → head norm" if fam.q_head_norm else "")
    yarn = f" + YaRN ×{a.rope_factor:g}" if role.yarn else ""
    steps = [
        Step(f"{p}.kv_proj", p, "kv_proj", "attention", "shared KV projection", "wkv → kv_norm (K = V)", 0, 0,
             owns=("wkv", "kv_norm"), code=("engine.model.attention.Attention.forward", "engine.model.norm.RMSNorm"),
             inputs=(("x", s.hidden),), outputs=(("kv", s.kv),)),
        Step(f"{p}.q_lora", p, "q_lora", "attention", "q low-rank projection", q_chain, 1, 0,
             owns=("wq_a", "q_norm", "wq_b"), code=("engine.model.attention.Attention.queries",),
             inputs=(("x", s.hidden),), outputs=(("q", s.q), ("qr (to the indexer)", s.q_latent))),
        Step(f"{p}.rope", p, "rope", "attention", "RoPE" + (" + YaRN" if role.yarn else ""),
             f"last {a.rope_head_dim} dims · base {role.rope_base:g}{yarn}", 0, 1, span=2,
             code=("engine.model.rope.rope_frequencies", "engine.model.rope.Rotary", "engine.model.rope.apply_rope"),
             inputs=(("q", s.q), ("kv", s.kv)), outputs=(("q rotated", s.q), ("kv rotated", s.kv))),
    ]
    edges = [StepEdge("in", "kv_proj", ""), StepEdge("in", "q_lora", ""),
             StepEdge("kv_proj", "rope", f"kv {s.kv}"), StepEdge("q_lora", "rope", f"q {s.q}")]
    lanes = 2
    if role.ratio and not role.draft:
        lanes = 3
        steps += _memory_steps(a, role, p, s, edges)
    sink = "sink" if not role.draft else "sink · non-causal block"
    steps += [
        Step(f"{p}.sparse_attn", p, "sparse_attn", "attention", "sparse attention with sink",
             f"{s.attended_rows(role)} · {sink}", 0, 2, span=lanes, owns=("attn_sink",),
             code=(("engine.model.draft.DraftAttention.forward",) if role.draft else
                   ("engine.model.sparse_attn.sparse_attn", "engine.model.attention.window_index")),
             inputs=(("q", s.q), ("window K=V rows", s.window)) + (
                 (("compressed rows", s.compressed_rows(role.ratio)), ("index list", s.index_list))
                 if role.ratio and role.indexer != "none" else
                 (("compressed rows", s.compressed_rows(role.ratio)),) if role.ratio and not role.draft else ()),
             outputs=(("o", s.q),)),
        Step(f"{p}.wo", p, "wo", "attention", "grouped low-rank output",
             f"{a.o_groups} groups × rank {a.o_lora_rank}", 0, 3, owns=("wo_a", "wo_b"),
             code=("engine.model.attention.Attention.forward",),
             inputs=(("o", s.q),), outputs=(("grouped", s.grouped), ("y", s.hidden))),
    ]
    edges += [StepEdge("rope", "sparse_attn", f"q {s.q} · kv {s.kv}"), StepEdge("sparse_attn", "wo", f"o {s.q}"),
              StepEdge("wo", "out", s.hidden)]
    return steps, edges


def _memory_steps(a: ModelArgs, role: LayerRole, p: str, s: Shapes, edges: list[StepEdge]) -> list[Step]:
    """Lane 2: where the compressed rows and the index list come from (own, Reindex, or read from another layer)."""
    rows = s.compressed_rows(role.ratio)
    out = []
    if role.kv_mode == "own":
        out.append(Step(f"{p}.compressor", p, "compressor", "attention", "Compressor",
                        f"ratio {role.ratio} · {_pooling(a, role.ratio)}",
                        2, 0, module=True, inputs=(("x", s.hidden),), outputs=(("compressed rows", rows),)))
        edges.append(StepEdge("in", "compressor", ""))
        memory = "compressor"
    else:
        src = f"layers.{role.kv_source}.attn.compressor"
        out.append(Step(f"{p}.compressed_kv", p, "compressed_kv", "attention", f"KV ← layer {role.kv_source}",
                        "its compressed rows, reused", 2, 0, reads=src,
                        code=("engine.model.attention.Attention._compressed",),
                        outputs=(("compressed rows", rows),)))
        memory = "compressed_kv"
    has_index = role.indexer != "none"
    edges.append(StepEdge(memory, "sparse_attn", f"rows {rows}", "bypass" if has_index else "down"))
    if role.indexer in ("own", "reindex"):
        keys = s.index_keys(role.ratio)
        how = (f"{a.index_n_heads} heads · top-{a.index_topk}" if role.indexer == "own" else
               f"Reindex: layer {role.index_key_source}'s keys" + (" · candidates" if role.uses_candidates else ""))
        out.append(Step(f"{p}.indexer", p, "indexer", "attention",
                        "Lightning indexer" + (" (Reindex)" if role.indexer == "reindex" else ""), how, 2, 1,
                        module=True, inputs=(("qr", s.q_latent), ("index keys", keys)),
                        outputs=(("index list", s.index_list),)))
        edges.append(StepEdge("q_lora", "indexer", f"qr {s.q_latent}", "diag"))
        if role.indexer == "own" and not family_roles(a).key_compressor:
            edges.append(StepEdge("compressor", "indexer", f"latents {rows}"))
        elif role.indexer == "reindex":
            edges.append(StepEdge("compressed_kv", "indexer", f"keys {keys}"))
        edges.append(StepEdge("indexer", "sparse_attn", f"ids {s.index_list}"))
    elif role.indexer == "reuse":
        src = f"layers.{role.index_source}.attn.indexer"
        out.append(Step(f"{p}.index_reuse", p, "index_reuse", "attention", f"index ← layer {role.index_source}",
                        f"its top-{a.index_topk} list, reused", 2, 1, reads=src,
                        code=("engine.model.attention.Attention._compressed",),
                        outputs=(("index list", s.index_list),)))
        edges.append(StepEdge("index_reuse", "sparse_attn", f"ids {s.index_list}"))
    return out


def _pooling(a: ModelArgs, ratio: int) -> str:
    if ratio == 1:
        return "one row per token"
    if ratio == family_roles(a).overlap_ratio:   # V4 CSA: each row pools two overlapping windows
        return f"gated pooling of {2 * ratio} tokens (overlap)"
    return f"gated pooling of {ratio} tokens"


def moe_steps(a: ModelArgs, role: LayerRole) -> tuple[list[Step], list[StepEdge]]:
    """Router → routed experts (+ the shared expert) → combine (spec §4.5; V4's hash-routed layers)."""
    p, s = f"{role.path}.ffn", Shapes(a)
    n_exp = a.draft_n_routed_experts if role.draft else a.n_routed_experts
    k = a.draft_n_activated_experts if role.draft else a.n_activated_experts
    routing = s.routing(role)
    router = (Step(f"{p}.gate", p, "gate", "ffn", "Hash router", f"tid2eid[token id] · top-{k}", 0, 0, module=True,
                   inputs=(("token ids", s.ids), ("x", s.hidden)), outputs=(("ids, weights", routing),))
              if role.hash_routed else
              Step(f"{p}.gate", p, "gate", "ffn", "Router", f"sqrt-softplus · top-{k} of {n_exp}", 0, 0, module=True,
                   inputs=(("x", s.hidden),), outputs=(("ids, weights", routing),)))
    steps = [
        router,
        Step(f"{p}.shared_experts", p, "shared_experts", "ffn", f"Shared expert ×{a.n_shared_experts}",
             f"SwiGLU {a.dim} → {a.moe_inter_dim} → {a.dim}", 1, 0, module=True,
             inputs=(("x", s.tokens_flat),), outputs=(("y_shared", s.tokens_flat),)),
        Step(f"{p}.experts", p, "experts", "ffn", f"Routed experts ×{n_exp}", f"{k} per token · SwiGLU", 0, 1,
             module=True, inputs=(("x", s.tokens_flat), ("ids, weights", routing)),
             outputs=(("Σ w·E(x)", s.tokens_flat),)),
        Step(f"{p}.combine", p, "combine", "ffn", "combine", f"Σ w·E(x) (×{a.route_scale:g}) + shared", 0, 2,
             code=("engine.model.moe.MoE.forward", "engine.model.moe.MoE.routed_experts"),
             inputs=(("routed", s.tokens_flat), ("shared", s.tokens_flat)), outputs=(("y", s.hidden),)),
    ]
    edges = [StepEdge("in", "gate", ""), StepEdge("in", "shared_experts", ""),
             StepEdge("gate", "experts", f"ids, weights {routing}"),
             StepEdge("experts", "combine", s.tokens_flat),
             StepEdge("shared_experts", "combine", s.tokens_flat, "elbow"),
             StepEdge("combine", "out", s.hidden)]
    return steps, edges


def steps_of(a: ModelArgs, role: LayerRole, which: str) -> tuple[list[Step], list[StepEdge]]:
    """which: 'attn' or 'ffn'."""
    return attention_steps(a, role) if which == "attn" else moe_steps(a, role)


def step_index(a: ModelArgs) -> dict[str, Step]:
    """Every step of every attention and MoE module, by id (graph modules included)."""
    out = {}
    for role in a.roles:
        for which in ("attn", "ffn"):
            out.update((st.id, st) for st in steps_of(a, role, which)[0])
    return out
