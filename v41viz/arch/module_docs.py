"""What each kind of module does, why it is there, and its formula, in the project's own words."""
from __future__ import annotations

from dataclasses import dataclass

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole


@dataclass(frozen=True)
class ModuleDoc:
    title: str
    summary: str       # one line: the hover text
    what: str          # what it computes
    why: str           # why the architecture has it
    formula: str       # pseudocode, monospace


def describe(module_type: str, args: ModelArgs, role: LayerRole | None = None) -> ModuleDoc:
    try:
        fn = _DOCS[module_type]
    except KeyError:
        raise KeyError(f"no explanation written for module type {module_type!r}") from None
    return fn(args, role)


def _embed(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Token embedding", f"Looks up a {a.dim}-wide vector for each of the {a.vocab_size:,} token ids.",
        f"A table of {a.vocab_size:,} rows × {a.dim}: the token id picks a row (a gather, not a matmul). "
        f"The row is copied into all {a.hc_mult} mHC residual streams, so the stack starts with "
        f"{a.hc_mult} identical streams.",
        "Positions are not added here: RoPE inside attention carries them. The table is not tied to the LM "
        "head; the DSpark drafter reuses this same table to embed its draft ids, so it has no copy of its own.",
        f"h = embed.weight[ids]            # [B, S, {a.dim}]\n"
        f"X = h repeated into {a.hc_mult} streams     # [B, S, {a.hc_mult}, {a.dim}]")


def _head(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "LM head", f"Scores all {a.vocab_size:,} tokens from the final {a.dim}-wide state, in fp32.",
        f"A linear map {a.dim} → {a.vocab_size:,} applied to the normalised, collapsed residual. In decoding only "
        "the last position is scored, which is the largest single matmul per generated token.",
        "Untied from the embedding. It runs in fp32 so that near-tied logits still sample correctly; the "
        "drafter's base logits reuse it, and its Markov head adds a cheap correction on top.",
        f"logits = norm(collapse(X)).float() @ head.weightᵀ     # [B, {a.vocab_size}]")


def _block(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    where = _role_text(a, r)
    return ModuleDoc(
        f"Transformer layer {r.layer}" if r else "Transformer layer",
        "One block: mHC collapse → RMSNorm → attention → mHC expand, then the same around the MoE FFN.",
        f"The residual is {a.hc_mult} streams of width {a.dim}. Each of the two sublayers reads one mixture of "
        "the streams, normalises it, computes, and writes the result back into every stream through a learned "
        f"{a.hc_mult}×{a.hc_mult} mixing matrix. {where}",
        "Attention is the only place positions exchange information; the FFN transforms each token alone. "
        "Layers differ in where their attention gets its compressed memory (the role table) and, depending on "
        "the config, in an Engram lookup before the block or a hash-routed FFN.",
        "X = expand(attn(attn_norm(collapse(X))), X)     # mHC site 'hc_attn'\n"
        "X = expand(moe(ffn_norm(collapse(X))), X)       # mHC site 'hc_ffn'")


def _draft_block(a: ModelArgs, r) -> ModuleDoc:
    if not a.has_dspark:
        return ModuleDoc(
            "MTP layer", "An extra block trained to predict one token further ahead.",
            "A full transformer block that combines the backbone's last hidden state with the embedding of the "
            "next token and predicts the token after it, through the shared LM head.",
            "It densifies the training signal and can serve as a one-token draft for speculative decoding.",
            "h' = block(proj([norm(h_t) ; norm(embed(x_{t+1}))]))  →  head(h')")
    return ModuleDoc(
        f"DSpark stage {r.layer - a.n_layers}" if r else "DSpark stage",
        f"A drafter block: {a.draft_n_routed_experts} experts top-{a.draft_n_activated_experts}, "
        "window attention only.",
        f"An ordinary block (mHC, attention, MoE) that runs over the {a.dspark_block_size} draft positions at once. "
        f"Its attention sees a private {a.window_size}-slot ring of keys built from the backbone's tapped states "
        "plus all draft rows (non-causal within the block).",
        f"{a.n_draft_stages} cheap stages instead of the {a.n_layers}-layer backbone make drafting several tokens "
        "cost a fraction of a "
        "target step; verification keeps the output distribution exactly the target's.",
        "X = embed([anchor, noise×4]) in 4 streams\nfor stage in 0..2: X = stage(X, ring = main_x window)")


def _rmsnorm(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "RMSNorm", f"Scales each vector to unit RMS (eps {a.norm_eps:g}) and applies a learned gain.",
        "Divides by the root-mean-square over the channels, in fp32, then multiplies by a per-channel weight. "
        "No mean subtraction, no bias.",
        "Pre-norm placement keeps the residual streams themselves unnormalised, which is what lets deep stacks "
        "train; the final one tames the residual's growth before the head.",
        f"y = w * x / sqrt(mean(x²) + {a.norm_eps:g})       # fp32, cast back")


def _mhc(a: ModelArgs, r) -> ModuleDoc:
    n, single = a.hc_mult, a.family == "v4.1"
    return ModuleDoc(
        "mHC site (manifold-constrained hyper-connection)",
        f"Reads the {n} residual streams into one sublayer input and writes the output back through a "
        f"doubly stochastic {n}×{n} mix.",
        f"From the flattened streams ({n}×{a.dim} = {a.hc_dim}) one linear map makes {a.hc_mix_dim} numbers per "
        f"token: {n} read weights (pre), {n} write weights (post) and a {n}×{n} stream-to-stream matrix, pushed "
        f"to doubly stochastic by {a.hc_sinkhorn_iters} Sinkhorn iterations."
        + (" V4.1 is 'single-pass': a site uses the pre weights computed by the previous site." if single else ""),
        "A single residual forces every layer to read and write one shared vector. Several streams let layers "
        "write to different places; the doubly stochastic constraint keeps the total signal from growing or "
        f"vanishing across {2 * a.n_layers} mixes.",
        "m = (flatten(X) @ fnᵀ) * rsqrt(mean(flatten(X)²))\n"
        "pre = sigmoid(m[0:4]·s0 + b) ; post = 2·sigmoid(m[4:8]·s1 + b)\n"
        "C = sinkhorn(softmax_rows(m[8:24]·s2 + b))\nX'_b = post_b · F + Σ_a C[a,b] · X_a")


def _hc_head(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "mHC head", f"Collapses the {a.hc_mult} streams into one vector before the final norm (V4 only).",
        "A learned read-out with its own fn/base/scale parameters, computed from the final streams.",
        "V4.1 removed it: there the last layer's FFN-site pre weights do the collapse (single-pass chain).",
        "h = Σ_c sigmoid(m_c·s + b_c) · X_c")


def _attention(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    mem = f"a window of the last {a.window_size} tokens"
    if r and r.ratio:
        src = "its own compressor" if r.kv_mode == "own" else f"layer {r.kv_source}'s compressor"
        mem += f" plus compressed rows (one per {r.ratio} tokens) from {src}"
    return ModuleDoc(
        "Attention", f"{a.n_heads} query heads over one shared {a.head_dim}-wide key=value head; sees {mem}.",
        f"Queries go through a rank-{a.q_lora_rank} bottleneck (wq_a, q_norm, wq_b). One latent of {a.head_dim} "
        f"channels per token (wkv, kv_norm) is both key and value; RoPE rotates its last {a.rope_head_dim} "
        f"channels. The query attends to {mem}, with a learned per-head sink in the softmax. The output is "
        f"projected back in {a.o_groups} head groups through rank-{a.o_lora_rank} factors (wo_a, wo_b).",
        "Sharing a single head for K and V makes the cache tiny; compressing along the sequence axis and "
        f"letting the indexer pick {a.index_topk} rows keeps a million-token context affordable. The sink lets a "
        "head attend to nothing.",
        f"q = wq_b(q_norm(wq_a(x)))        # [B,S,{a.n_heads},{a.head_dim}], rope on last {a.rope_head_dim}\n"
        f"kv = kv_norm(wkv(x))             # [B,S,{a.head_dim}]  (K = V)\n"
        f"o = softmax_with_sink(q·kv[idx] / √{a.head_dim}) · kv[idx]\n"
        f"y = wo_b(grouped wo_a(o))        # {a.o_groups} groups → [B,S,{a.dim}]")


def _compressor(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    ratio = r.ratio if r else 0
    shared = a.family == "v4.1"
    return ModuleDoc(
        "KV compressor", f"Turns every {ratio} tokens into one compressed key=value row"
        + (" that later layers reuse." if shared else "."),
        (f"Ratio {ratio}: " + ("one latent per token (wkv, norm)." if ratio == 1 else
         f"a gated softmax over each group of {ratio} tokens, per channel (wkv, wgate), then a norm."))
        + " The pre-RoPE latent also feeds the indexer's keys; the stored row is rotated at the group's first "
        "position and quantised to FP4.",
        ("In V4.1 only the first layer of each same-ratio run compresses; the following layers read its rows, "
         "so the global cache is stored once per run." if shared else
         "Each compressed V4 layer keeps its own coarse memory: CSA rows every 4 tokens, HCA every 128."),
        f"latent_j = norm(Σ_t∈group_j softmax_t(wgate(x_t)) ⊙ wkv(x_t))     # ratio {ratio}")


def _indexer(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    mode = r.indexer if r else "own"
    how = {"own": "scores its own keys (built from the compressor's latents) with its own queries",
           "reindex": f"uses its own queries against layer {r.index_key_source if r else '?'}'s keys, "
                      "restricted to the candidate blocks"}.get(mode, "")
    return ModuleDoc(
        "Lightning indexer", f"Picks the top-{a.index_topk} compressed rows each query attends to.",
        f"{a.index_n_heads} small heads of {a.index_head_dim} dims score every visible compressed row: a ReLU dot "
        f"product weighted per head, then a top-{a.index_topk}. This layer {how}."
        + (f" Layer {a.candidate_source_layer} also builds a pool of the best {a.candidate_topk_blocks} blocks of "
           f"{a.candidate_block_size} rows that later Reindex layers search within."
           if a.candidate_source_layer >= 0 else ""),
        f"Attention then costs O({a.index_topk}) per query instead of O(context). The scorer is cheap: tiny heads, FP4 "
        "keys and queries, no value path.",
        "I[s,t] = Σ_h w[s,h] · relu(q[s,h] · k[t])\n" f"idx = topk(I[s, visible], {a.index_topk})")


def _moe(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    draft = bool(r and r.draft)
    e = a.draft_n_routed_experts if draft else a.n_routed_experts
    k = a.draft_n_activated_experts if draft else a.n_activated_experts
    return ModuleDoc(
        "Mixture-of-experts FFN", f"{e} narrow SwiGLU experts, {k} chosen per token, plus {a.n_shared_experts} shared.",
        f"A router picks {k} of {e} experts for each token; each expert is a SwiGLU MLP {a.dim} → {a.moe_inter_dim} → "
        f"{a.dim}. Their outputs are summed with the routing weights (×{a.route_scale:g}) and added to the always-on "
        "shared expert.",
        "Stored capacity grows with the number of experts while the compute per token stays that of "
        f"{k + a.n_shared_experts} small MLPs.",
        f"y = Σ_(e in top{k}) w_e · E_e(x) + shared(x)\n"
        f"E(x) = w2(silu(min(w1 x, {a.swiglu_limit:g})) · clamp(w3 x, ±{a.swiglu_limit:g}))")


def _gate(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Router (gate)", "sqrt(softplus(x·W)) scores; a selection-only bias chooses the top-k.",
        "Scores each expert in fp32 with sqrt(softplus(·)). A per-expert bias is added only to choose the top-k "
        f"(a second bias vector serves image tokens); the weights are the unbiased scores, renormalised and "
        f"scaled by {a.route_scale:g}.",
        "The bias balances expert load without an auxiliary loss pulling against the language-model objective.",
        "s = sqrt(softplus(x @ Wᵀ))\nidx = topk(s + bias)\nw = s[idx] / Σ s[idx] · route_scale")


def _hash_gate(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Hash router", f"The first {a.n_hash_layers} V4 layers pick experts from the token id alone.",
        "A fixed table (tid2eid) maps each token id to its experts; nothing depends on context.",
        "Perfectly predictable load for the earliest layers, where context has mixed in least. V4.1 dropped it.",
        "idx = tid2eid[token_id]")


def _shared(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Shared expert", "An expert every token runs, with no routing weight.",
        f"A SwiGLU MLP {a.dim} → {a.moe_inter_dim} → {a.dim} in FP8, added to the routed sum.",
        "Common patterns are learned once here instead of being copied into many routed experts.",
        "y_shared = w2(silu(w1 x) · w3 x)")


def _experts(a: ModelArgs, r: LayerRole | None) -> ModuleDoc:
    e = a.draft_n_routed_experts if r and r.draft else a.n_routed_experts
    fmt = a.expert_dtype or a.dtype
    return ModuleDoc(
        "Routed experts", f"{e} SwiGLU MLPs stored in {fmt}; a token runs only the ones it was routed to.",
        f"Each expert has w1, w3 [{a.moe_inter_dim}, {a.dim}] and w2 [{a.dim}, {a.moe_inter_dim}]. The routing weight "
        "multiplies the hidden activation before the down projection.",
        "These weights dominate the checkpoint; FP4 storage with per-32 scales halves them again compared "
        "to FP8, and the SwiGLU clamp keeps activations in range.",
        "h = silu(min(w1 x, L)) · clamp(w3 x, −L, L) · w_e\ny_e = w2 h")


def _engram(a: ModelArgs, r) -> ModuleDoc:
    cols = a.engram_n_columns
    return ModuleDoc(
        "Engram", f"Hashes the last 2–{a.engram_max_ngram_size} tokens into {cols} table rows and gates their "
        "value into each stream.",
        f"Token ids are first mapped to {a.engram_compressed_vocab_size:,} normalised ids. "
        f"For n = 2..{a.engram_max_ngram_size} "
        f"and {a.engram_n_heads} heads, an XOR of multiplied ids modulo a prime picks one row of width "
        f"{a.engram_head_dim} ({cols} rows, {cols * a.engram_head_dim} values). wkv turns them into {a.hc_mult} keys "
        "and one value; a per-stream sigmoid gate from the key and the stream adds the value.",
        "A lookup memory for local n-gram facts: cheap to read (row gathers from host memory), huge in "
        "capacity, and it frees the MoE from memorising fixed phrases. It runs before the layer's block.",
        f"rows = table[hash_n,h(c_t, c_{{t-1}}, ...)]   # [B,S,{cols},{a.engram_head_dim}]\n"
        "key, value = split(wkv(flatten(rows)))\n"
        "g_c = sigmoid(signed_sqrt(<norm(h_c)·w_c, norm(key_c)> / √dim))\nh_c += g_c · value")


def _main_proj(a: ModelArgs, r) -> ModuleDoc:
    taps = ", ".join(map(str, a.dspark_target_layer_ids))
    return ModuleDoc(
        "DSpark main_proj", f"Projects the tapped residuals of layers {taps} into one {a.dim}-wide feature.",
        f"The stream-mean of the residual entering layers {taps} is concatenated "
        f"({len(a.dspark_target_layer_ids)}×{a.dim}) and projected to {a.dim}, then normalised (main_norm). "
        "Every stage turns this into the keys of its private window ring.",
        "Late backbone states already carry the next-token evidence, so the drafter reads them instead of "
        "running a deep stack of its own.",
        "main_x = main_norm(main_proj(concat(" + ", ".join(f"mean_streams(h_{t})" for t in a.dspark_target_layer_ids)
        + ")))")


def _main_norm(a, r) -> ModuleDoc:
    d = _rmsnorm(a, r)
    return ModuleDoc("DSpark main_norm", "RMSNorm of the projected tap features.", d.what,
                     "Keeps the drafter's window keys on the scale its attention was trained on.", d.formula)


def _draft_norm(a, r) -> ModuleDoc:
    d = _rmsnorm(a, r)
    return ModuleDoc("DSpark final norm", "RMSNorm of the collapsed draft streams before the shared LM head.",
                     d.what, "The drafter's own final norm; the LM head itself is the backbone's.", d.formula)


def _markov(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Markov head", f"Adds a rank-{a.dspark_markov_rank} previous-token correction to each draft's logits.",
        f"For draft k, the previously drafted token selects a {a.dspark_markov_rank}-wide row of embed; its dot "
        f"with head gives a bias over all {a.vocab_size:,} tokens added to the base logits. Drafts are sampled "
        "left to right through this chain.",
        "The stages see noise tokens at later positions; the Markov term restores the dependence on what was "
        "actually drafted, at the cost of two thin matrices.",
        "L_k = U_k + markov.embed[x_k] @ markov.headᵀ\nx_{k+1} = sample(L_k)")


def _confidence(a: ModelArgs, r) -> ModuleDoc:
    return ModuleDoc(
        "Confidence head", "Predicts the chance each draft survives verification.",
        f"A single linear map from [draft state ; Markov row] ({a.dim}+{a.dspark_markov_rank}) to one logit per draft. "
        "sigmoid gives the survival chance given the earlier drafts were accepted; the product along the block "
        "is the prefix survival.",
        "The scheduler verifies only as many drafts as pays off for the batch, instead of always verifying all.",
        "c_k = sigmoid(proj([Hd_k ; e_k]))\na_k = Π_{i≤k} c_i")


_DOCS = {
    "embed": _embed, "head": _head, "block": _block, "draft_block": _draft_block, "rmsnorm": _rmsnorm,
    "mhc": _mhc, "hc_head": _hc_head, "attention": _attention, "compressor": _compressor, "indexer": _indexer,
    "moe": _moe, "gate": _gate, "hash_gate": _hash_gate, "shared_experts": _shared, "experts": _experts,
    "engram": _engram, "main_proj": _main_proj, "main_norm": _main_norm, "draft_norm": _draft_norm,
    "markov_head": _markov, "confidence_head": _confidence,
}


def _role_text(a: ModelArgs, r: LayerRole | None) -> str:
    if r is None:
        return ""
    bits = [f"This layer: {r.summary}."]
    if r.ratio:
        bits.append(f"RoPE base {r.rope_base:g}" + (" with YaRN." if r.yarn else "."))
    return " ".join(bits)
