"""What each step of an opened attention or MoE box does and why, in the project's own words (module steps such as
the compressor or the router are explained by module_docs)."""
from __future__ import annotations

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole, family_roles

from .module_docs import ModuleDoc


def describe_step(name: str, a: ModelArgs, role: LayerRole) -> ModuleDoc:
    try:
        fn = _DOCS[name]
    except KeyError:
        raise KeyError(f"no explanation written for step {name!r}") from None
    return fn(a, role)


def _kv_proj(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    return ModuleDoc(
        "Shared KV projection", f"One {a.head_dim}-wide latent per token that is both the key and the value.",
        f"wkv maps the normalised input ({a.dim}) to {a.head_dim} channels and kv_norm normalises them. All "
        f"{a.n_heads} query heads read this one head; RoPE then rotates its last {a.rope_head_dim} channels, and the "
        f"newest {a.window_size} rows wait in the window ring.",
        "A single shared K=V head makes the per-token cache one vector instead of one per head (multi-query "
        "attention taken to its limit); the heads differ only in their queries.",
        "kv = kv_norm(x @ wkvᵀ)          # [B, S, D]   engine: Attention.forward\n"
        "kv = apply_rope(kv, cis)        # keys and values are the same rows")


def _q_lora(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    v4 = family_roles(a).q_head_norm
    return ModuleDoc(
        "Query low-rank projection", f"Queries through a rank-{a.q_lora_rank} bottleneck: {a.dim} → {a.q_lora_rank} → "
        f"{a.n_heads}×{a.head_dim}.",
        f"wq_a compresses the input to {a.q_lora_rank} channels, q_norm normalises them (this latent, qr, also "
        f"feeds the lightning indexer's queries), and wq_b expands it to {a.n_heads} heads of {a.head_dim}."
        + (" V4 then normalises each head on its own (an RMS norm without weights)." if v4 else ""),
        f"A full {a.dim} × {a.n_heads * a.head_dim} query matrix would be large; the factorised one is a fraction of "
        "it, and the shared latent lets the indexer score with almost no extra work.",
        "qr = q_norm(x @ wq_aᵀ)                 # [B, S, q_rank]\n"
        "q  = (qr @ wq_bᵀ).unflatten(H, D)      # [B, S, H, D]"
        + ("\nq  = rms_normalize(q)                  # per head (V4)" if v4 else ""))


def _rope(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    yarn = (f" YaRN stretches the long wavelengths by {a.rope_factor:g} (original context "
            f"{a.original_seq_len:,}), leaving the short ones as trained." if r.yarn else "")
    return ModuleDoc(
        "Rotary position embedding" + (" with YaRN" if r.yarn else ""),
        f"Rotates the last {a.rope_head_dim} channels of q and kv by position (base {r.rope_base:g}).",
        f"Pairs of the last {a.rope_head_dim} channels turn by angle position × θ_i, "
        f"θ_i = base^(−2i/{a.rope_head_dim}) "
        f"with base {r.rope_base:g}.{yarn} Because the value is the rotated key, the attention output is rotated back "
        "(the inverse rotation) before the output projection.",
        "Positions enter only here: a query–key dot product then depends on their distance alone. "
        + ("Compressed layers use a larger base and YaRN so that million-token distances stay in range."
           if r.ratio else "Window-only layers see at most the window, so the plain base suffices."),
        "θ_i = base^(−2i/rope) (YaRN: blended with θ_i/factor)\n"
        "x[..., −rope:] ← x[..., −rope:] · e^{i·pos·θ}    # interleaved pairs\n"
        "o ← apply_rope(o, cis, inverse=True)             # after attention")


def _compressed_kv(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    return ModuleDoc(
        f"Compressed KV read from layer {r.kv_source}",
        f"This layer has no compressor: it attends layer {r.kv_source}'s compressed rows.",
        f"In V4.1 only the KV source layers compress (layer {r.kv_source} here, ratio {r.ratio}); the layers "
        "after a source, up to the next one, read the rows it publishes into the shared cache, one row per "
        + ("token." if r.ratio == 1 else f"{r.ratio} tokens.")
        + (f" Its lightning indexer re-scores layer {r.index_key_source}'s index keys "
           "with this layer's own queries (Reindex)." if r.indexer == "reindex" else ""),
        "The global memory is stored once per run of layers instead of once per layer, which divides the "
        "compressed part of the KV cache by the length of the run.",
        f"rows = cache.comp_kv[{r.kv_source}][:, :T/{r.ratio}]     # engine: Attention._compressed")


def _index_reuse(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    return ModuleDoc(
        f"Index list reused from layer {r.index_source}",
        f"This layer has no indexer: it attends the top-{a.index_topk} rows layer {r.index_source} chose.",
        f"Layer {r.index_source}'s lightning indexer picked, for every query, {a.index_topk} compressed rows; this "
        "layer reads the same positions of the same compressed cache, so it skips the scoring entirely.",
        "Neighbouring layers attend largely the same far-away tokens; reusing the list saves the indexer's "
        "queries and its O(context) scoring pass.",
        f"idx = ctx.topk[{r.index_source}]        # engine: Attention._compressed")


def _sparse_attn(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    if r.draft:
        reads = (f"the drafter's ring of {a.window_size} keys built from the tapped backbone states, plus every row "
                 "of the draft block (non-causal inside the block)")
    elif not r.ratio:
        reads = f"its window: the last {a.window_size} tokens"
    elif r.indexer == "none":
        reads = f"its window of {a.window_size} tokens plus every visible compressed row (no indexer: V4 HCA)"
    else:
        reads = f"its window of {a.window_size} tokens plus the {a.index_topk} compressed rows of its index list"
    return ModuleDoc(
        "Sparse attention with sink", f"Each query reads {reads}.",
        f"For each of the {a.n_heads} heads, the logits q·k/√{a.head_dim} over the listed rows go through a softmax "
        "whose denominator also holds e^sink, a learned per-head logit (attn_sink) with no value: probability "
        "mass a head gives the sink is attention to nothing. Keys and values are the same rows.",
        "The listed rows are a fixed number per query, so the cost does not grow with the context; the sink lets "
        "a head stay quiet instead of spreading weight over rows it does not need.",
        "p_j = e^{l_j} / (Σ_j e^{l_j} + e^{sink_h}),  l = q·kv[idx] / √D\n"
        "o = Σ_j p_j · kv[idx_j]               # [B, S, H, D]   engine: sparse_attn")


def _wo(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    per = a.n_heads * a.head_dim // a.o_groups
    return ModuleDoc(
        "Grouped low-rank output", f"{a.n_heads} heads in {a.o_groups} groups, each through a rank-{a.o_lora_rank} "
        f"bottleneck, then one projection to {a.dim}.",
        f"The heads' outputs ({a.n_heads}×{a.head_dim}) are split into {a.o_groups} groups of {per} channels; wo_a "
        f"maps each group to {a.o_lora_rank} channels with its own block of weights, and wo_b maps the "
        f"{a.o_groups}×{a.o_lora_rank} concatenation to {a.dim}.",
        f"A dense output matrix would read {a.n_heads * a.head_dim} channels; the grouped factorisation costs "
        f"{a.o_groups}×{a.o_lora_rank}×{per} + {a.o_groups * a.o_lora_rank}×{a.dim} weights instead.",
        f"z_g = o_g @ wo_a[g]ᵀ              # [B, S, {a.o_groups}, {a.o_lora_rank}]\n"
        f"y = flatten(z) @ wo_bᵀ            # [B, S, {a.dim}]   engine: Attention.forward")


def _combine(a: ModelArgs, r: LayerRole) -> ModuleDoc:
    k = a.draft_n_activated_experts if r.draft else a.n_activated_experts
    return ModuleDoc(
        "Combine", f"Adds the {k} routed experts' outputs, weighted by the router, to the shared expert's.",
        "Tokens are sorted by expert so that each chosen expert runs once on its own tokens; each output row is "
        f"multiplied by its routing weight (renormalised, ×{a.route_scale:g}) and added back at the token's "
        "position; the shared expert's output is added to every token.",
        "The weights make the mixture differentiable in the router; the shared expert carries what every "
        "token needs, so the routed experts can specialise.",
        "y = Σ_(e in top-k) w_e · E_e(x) + shared(x)     # engine: MoE.forward, MoE.routed_experts")


_DOCS = {"kv_proj": _kv_proj, "q_lora": _q_lora, "rope": _rope, "compressed_kv": _compressed_kv,
         "index_reuse": _index_reuse, "sparse_attn": _sparse_attn, "wo": _wo, "combine": _combine}
