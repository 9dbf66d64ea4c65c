"""The views: for each kind of diagram box, the statistics of its learned parameters, each reading only the tensors
it shows (the routed experts, most of the bytes, have their own opt-in view in expert_norms.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model.mhc import sinkhorn
from ..quant.formats import dequantize_engram_rows
from ..spec.roles import family_roles
from .collect import Collector, ViewResult, measured
from .expert_norms import Progress, expert_norms
from .reader import WeightReader, module_path

ENGRAM_SAMPLE_BLOCKS = 4      # contiguous blocks of rows read from each Engram column's hash table
ENGRAM_BLOCK_ROWS = 64        # rows per block: 256 rows a column (hashing spreads n-grams over a table evenly)
SLICE_ROWS = 1024             # rows of a large matrix dequantized at once (the release's main_proj: 60 MiB as float)


@dataclass(frozen=True)
class View:
    name: str
    title: str
    boxes: tuple[str, ...]            # the diagram's node types this view describes (v41viz.arch.graph)
    what: str
    body: Callable[[Collector], None]


def _layers(a) -> range:
    return range(a.n_layers + a.n_draft_stages)


def router(c: Collector) -> None:
    """The learned routing bias per expert (it shifts which experts win the top-k; the released model balances its
    load with it) and, beside it, the image tokens' bias `bias_vl`; hash-routed layers have neither."""
    a = c.reader.args
    for layer in _layers(a):
        p = module_path(layer, a)
        if layer < a.n_hash_layers:
            continue
        for which in ("bias", "bias_vl"):
            name = f"{p}.ffn.gate.{which}"
            if which == "bias" or c.wanted(name):
                t = c.get(name, f"{p}.ffn.gate")
                if t is not None:
                    c.add_many(f"{p}.ffn.gate", name, layer, "expert", which, t.float())


def router_weights(c: Collector) -> None:
    """The length of each expert's row of the router matrix: how strongly a token's direction can pick it."""
    a = c.reader.args
    for layer in _layers(a):
        p = module_path(layer, a)
        t = c.get(f"{p}.ffn.gate.weight", f"{p}.ffn.gate", WeightReader.weight)
        if t is not None:
            c.add_many(f"{p}.ffn.gate", f"{p}.ffn.gate.weight", layer, "expert", "row_norm", t.norm(dim=1))


def hash_routing(c: Collector) -> None:
    """V4's hash-routed layers: tid2eid [vocab, k] fixes each token's experts; the histogram counts the token ids
    each expert takes (a uniform table gives vocab·k / experts each)."""
    a = c.reader.args
    if not a.n_hash_layers:
        c.result.notes.append("this config has no hash-routed layers")
        return
    for layer in range(a.n_hash_layers):
        p = module_path(layer, a)
        t = c.get(f"{p}.ffn.gate.tid2eid", f"{p}.ffn.gate")
        if t is not None:
            counts = torch.bincount(t.reshape(-1).long().clamp(0, a.n_routed_experts), minlength=a.n_routed_experts)
            c.add_many(f"{p}.ffn.gate", f"{p}.ffn.gate.tid2eid", layer, "expert", "tokens",
                       counts[: a.n_routed_experts])
            if counts.numel() > a.n_routed_experts:   # an id past the last expert: a damaged table
                c.result.problems[f"{p}.ffn.gate.tid2eid"] = (
                    f"'{p}.ffn.gate.tid2eid' names {int(counts[a.n_routed_experts:].sum())} expert id(s) outside "
                    f"0..{a.n_routed_experts - 1}")


def mhc(c: Collector) -> None:
    """Each seam's static mixing: the learned base alone (what the mixes are with a zero input), through the same
    maps as the model: pre = sigmoid(base) + eps, post = 2·sigmoid(base), comb = Sinkhorn(base) (a doubly stochastic
    hc × hc matrix, cell a·hc + b); and the three scales that weigh the input-dependent part against it."""
    a = c.reader.args
    hc = a.hc_mult
    for layer in _layers(a):
        p = module_path(layer, a)
        for site in ("attn", "ffn"):
            module = f"{p}.hc_{site}"
            base = c.get(f"{p}.hc_{site}_base", module)
            scale = c.get(f"{p}.hc_{site}_scale", module)
            if base is not None:
                base = base.float()   # the model mixes in fp32
                name = f"{p}.hc_{site}_base"
                c.add_many(module, name, layer, "stream", "pre", torch.sigmoid(base[:hc]) + a.hc_eps)
                c.add_many(module, name, layer, "stream", "post", 2 * torch.sigmoid(base[hc:2 * hc]))
                comb = sinkhorn(base[2 * hc:].view(hc, hc), a.hc_sinkhorn_iters, a.hc_eps)   # [hc, hc]
                c.add_many(module, name, layer, "cell", "comb", comb)
            if scale is not None:
                c.add_many(module, f"{p}.hc_{site}_scale", layer, "part", "scale", scale.float())
    if family_roles(a).hc_head:   # V4: the learned final collapse of the streams
        for prefix, layer in [("", -1), *((f"mtp.{s}.", a.n_layers + s) for s in range(a.n_draft_stages))]:
            name = f"{prefix}hc_head_base"
            if c.wanted(name):
                base = c.get(name, prefix + "hc_head" if prefix else "hc_head")
                if base is not None:
                    c.add_many("hc_head", name, layer, "stream", "pre", torch.sigmoid(base.float()) + a.hc_eps)


def attention_sink(c: Collector) -> None:
    """The learned sink logit of each head: the weight of 'attend to nothing' in its softmax."""
    a = c.reader.args
    for layer in _layers(a):
        p = module_path(layer, a)
        t = c.get(f"{p}.attn.attn_sink", f"{p}.attn")
        if t is not None:
            c.add_many(f"{p}.attn", f"{p}.attn.attn_sink", layer, "head", "sink", t.float())


def norms(c: Collector) -> None:
    """Every RMSNorm's learned gain: mean, spread and range (a gain far from 1 rescales what the next matrix sees)."""
    from .reader import layer_of
    names = sorted(n for n in {*c.reader.weight_map, *c.reader.entries} if n.endswith("norm.weight"))
    for name in names:
        module = name.removesuffix(".weight")
        t = c.get(name, module)
        if t is None:
            continue
        t, layer = t.float(), layer_of(name, c.reader.args)
        for stat, value in (("mean", t.mean()), ("std", t.std() if t.numel() > 1 else 0.0), ("min", t.min()),
                            ("max", t.max())):
            c.add(module, name, layer, "", -1, stat, value)


def engram(c: Collector) -> None:
    """Engram's hash tables from a sample of rows per column (n-gram size × head): row length, value spread and the
    share of all-zero rows (buckets no n-gram trained); and its gate projections' lengths per stream (q, k). Its
    key / value projection wkv is left out: 150 MiB a layer in the release for a handful of norms."""
    a = c.reader.args
    if not a.has_engram:
        c.result.notes.append("this config has no Engram layers")
        return
    sizes = a.engram_layout.table_sizes()
    for i, layer in enumerate(a.engram_layer_ids):
        module = f"layers.{layer}.engram"
        table = f"{module}.embed.weight"
        if c.available(table, module):
            rows = c.reader.shape(table)[0]
            columns = sizes[i] if sum(sizes[i]) == rows else [rows]
            start = 0
            for col, size in enumerate(columns):
                sample = _engram_sample(c, table, start, size)
                if sample is not None:
                    lengths = sample.norm(dim=1)
                    for stat, value in (("row_norm_mean", lengths.mean()), ("row_norm_std", lengths.std()),
                                        ("value_std", sample.std()), ("zero_rows", (lengths == 0).float().mean()),
                                        ("rows_sampled", sample.size(0))):
                        c.add(module, table, layer, "column", col, stat, value)
                start += size
        for which in ("q_weight", "k_weight"):
            t = c.get(f"{module}.{which}", module)
            if t is not None:
                c.add_many(module, f"{module}.{which}", layer, "stream", "row_norm", t.float().norm(dim=1))


def _engram_sample(c: Collector, table: str, start: int, size: int) -> torch.Tensor | None:
    """Rows of one column's table [n, head_dim] as float32: ENGRAM_SAMPLE_BLOCKS blocks spread over it."""
    scale = table.removesuffix(".weight") + ".scale"
    block = min(ENGRAM_BLOCK_ROWS, size)
    starts = sorted({start + (size - block) * k // max(1, ENGRAM_SAMPLE_BLOCKS - 1)
                     for k in range(ENGRAM_SAMPLE_BLOCKS)})
    parts = []
    for s in starts:
        rows = c.get(table, table, lambda r, n: r.rows(n, s, s + block))
        if rows is None:
            return None
        if rows.dtype == torch.float8_e4m3fn:
            scales = c.get(scale, table, lambda r, n: r.rows(n, s, s + block))
            if scales is None:
                return None
            rows = dequantize_engram_rows(rows, scales)
        parts.append(rows.float())
    return torch.cat(parts)


def dspark(c: Collector) -> None:
    """The drafter's learned heads: the Markov head's singular values (W1, W2 [vocab, rank] and their product, the
    bigram logit matrix W1·W2ᵀ of rank r, all from the rank × rank Gram matrices, the factors read a slice at a
    time), the confidence head's weights on the hidden state and on the Markov features, and main_proj's blocks per
    tapped layer."""
    a = c.reader.args
    if not a.has_dspark or not a.n_draft_stages:
        c.result.notes.append("this config has no DSpark drafter")
        return
    last = f"mtp.{a.n_draft_stages - 1}"
    layer = a.n_layers + a.n_draft_stages - 1
    module = f"{last}.markov_head"
    grams = []
    for w in family_roles(a).markov_names:
        name = f"{module}.{w}.weight"
        gram = _gram(c, name, module)
        if gram is not None:   # σ(W) = sqrt(eigenvalues of WᵀW), largest first
            c.add_many(module, name, layer, "k", "singular_value", _sqrt_eigenvalues(gram))
            grams.append(gram)
    if len(grams) == 2:   # σ(W1·W2ᵀ)² = eigenvalues of G1^½ G2 G1^½ (those of G1·G2), G = WᵀW [rank, rank]
        root = _sqrt_psd(grams[0])
        c.add_many(module, module, layer, "k", "product_singular_value", _sqrt_eigenvalues(root @ grams[1] @ root))
    name = f"{last}.confidence_head.proj.weight"
    t = c.get(name, f"{last}.confidence_head", WeightReader.weight)
    if t is not None:
        w = t.reshape(-1).double()   # [dim + rank]: the hidden state's weights, then the Markov features'
        for part, piece in enumerate((w[: a.dim], w[a.dim:])):
            c.add(f"{last}.confidence_head", name, layer, "part", part, "norm", piece.norm())
        c.add_many(f"{last}.confidence_head", name, layer, "input", "weight", w)
    name = "mtp.0.main_proj.weight"
    if c.available(name, "mtp.0.main_proj"):   # [dim, taps·dim] → one block per tapped layer, a slice at a time
        taps, squares = len(a.dspark_target_layer_ids), torch.zeros(len(a.dspark_target_layer_ids), dtype=torch.float64)
        rows = c.reader.shape(name)[0]
        for start in range(0, rows, SLICE_ROWS):
            part = c.get(name, "mtp.0.main_proj", lambda r, n: r.weight_rows(n, start, min(rows, start + SLICE_ROWS)))
            if part is None:
                return
            squares += part.double().view(part.size(0), taps, -1).square().sum(dim=(0, 2))   # [rows, taps, dim]
        c.add_many("mtp.0.main_proj", name, a.n_layers, "tap", "norm", squares.sqrt())


def _gram(c: Collector, name: str, module: str) -> torch.Tensor | None:
    """WᵀW [cols, cols] in float64, W read SLICE_ROWS rows at a time (the release's Markov factors: 129,280 rows)."""
    if not c.available(name, module):
        return None
    rows = c.reader.shape(name)[0]
    gram = None
    for start in range(0, rows, SLICE_ROWS):
        part = c.get(name, module, lambda r, n: r.weight_rows(n, start, min(rows, start + SLICE_ROWS)))
        if part is None:
            return None
        part = part.double()
        gram = part.T @ part if gram is None else gram + part.T @ part
    return gram


def _sqrt_eigenvalues(symmetric: torch.Tensor) -> torch.Tensor:
    """sqrt of a symmetric PSD matrix's eigenvalues, largest first (rounding's tiny negatives read as 0)."""
    return torch.linalg.eigvalsh(symmetric).clamp_min(0).flip(0).sqrt()


def _sqrt_psd(symmetric: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(symmetric)
    return vectors @ torch.diag(values.clamp_min(0).sqrt()) @ vectors.T


VIEWS = {v.name: v for v in (
    View("router", "Router bias", ("gate", "moe"), "gate.bias per expert per layer (and bias_vl)", router),
    View("router_weights", "Router rows", ("gate", "moe"), "length of each expert's router row", router_weights),
    View("hash_routing", "Hash routing", ("hash_gate",), "tid2eid: token ids per expert", hash_routing),
    View("mhc", "mHC static mixing", ("mhc", "hc_head", "block", "draft_block"),
         "hc_base through sigmoid / Sinkhorn, hc_scale", mhc),
    View("attention_sink", "Attention sinks", ("attention",), "attn_sink per head per layer", attention_sink),
    View("norms", "Norm gains", ("rmsnorm", "draft_norm", "main_norm", "compressor", "indexer"),
         "mean, spread and range of every RMSNorm weight", norms),
    View("engram", "Engram", ("engram",), "sampled table rows, gate projections (q, k)", engram),
    View("dspark", "DSpark heads", ("markov_head", "confidence_head", "main_proj"),
         "Markov head singular values, confidence head", dspark),
)}
EXPERTS = "experts"   # the opt-in view (expert_norms.py): per-expert weight norms, most of the checkpoint's bytes


def run_view(reader: WeightReader, name: str) -> ViewResult:
    """One view's statistics; CheckpointError never escapes (it is recorded in the result)."""
    return measured(reader, name, VIEWS[name].body)


def run_views(reader: WeightReader, names: list[str] | None = None, experts: bool = False,
              progress: Progress | None = None) -> dict[str, ViewResult]:
    """The named views (default: all but the experts) and, only if asked, the expert norms (cached, with progress)."""
    out = {name: run_view(reader, name) for name in (names if names is not None else VIEWS) if name != EXPERTS}
    if experts:
        out[EXPERTS] = expert_norms(reader, progress)
    return out


def view_for(node_type: str) -> str | None:
    """The view that shows the learned parameters of a diagram box of this type (routed experts: EXPERTS)."""
    if node_type == "experts":
        return EXPERTS
    return next((v.name for v in VIEWS.values() if node_type in v.boxes), None)
