"""Memory plan: where every checkpoint tensor, KV cache and working buffer of a config goes on N GPUs and the host.

Two expert placements: "device" (routed experts partitioned over the GPUs, the datacenter route) and "host"
(one GPU; the routed experts of the backbone and the drafter stay in host RAM as stored and are computed on the
CPU for the tokens routed to them, everything else is on the GPU: the workstation route)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from functools import lru_cache
from math import ceil
from typing import TYPE_CHECKING

from ..accounting.accounting import GIB, KINDS, account, compressed_kv_bytes, index_key_bytes, kind_of, window_bytes
from ..accounting.inventory import inventory_tuple
from ..spec.errors import InputError
from ..spec.parallel_degree import uneven_counts

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

EXPERT_PLACEMENTS = ("device", "host")
PAGE = 4096  # one host page: a gathered Engram row brings at least one page of its tensor into RAM

LABELS = {"routed_experts": "routed experts", "shared_experts": "shared experts", "router": "router",
          "attention": "attention", "compressor": "compressor", "indexer": "indexer", "mhc": "mHC",
          "norms": "norms", "embedding": "embedding", "head": "LM head", "engram_tables": "Engram tables",
          "engram_projections": "Engram projections", "drafter": "DSpark / MTP drafter"}
RULES = {
    "routed_experts": "partitioned by expert: GPU r holds experts ⌈r·E/N⌉..⌈(r+1)·E/N⌉−1 of every layer",
    "shared_experts": "tensor-parallel like a dense MLP: w1/w3 rows split, w2 columns split",
    "attention": "query heads split (wq_b rows, attn_sink, wo_a groups, wo_b columns); wq_a, wkv, norms replicated",
    "embedding": "vocabulary split in N row blocks", "head": "vocabulary split in N row blocks",
    "engram_tables": "host, in the shard files; only the rows a token hashes to are read (positioned reads)",
    "drafter": "same rules inside each stage (experts by expert, heads split, Markov head by vocabulary)",
}
HOST_RULES = {  # the parts that change with the routed experts in host RAM (experts "host")
    "routed_experts": "host RAM, as stored (MXFP4): computed on the CPU for the tokens routed to them",
    "drafter": "its routed experts in host RAM like the backbone's; attention, Markov head, main_proj on the GPU",
}
REPLICATED = "replicated on every GPU (small)"
RUNTIME_RULES = {
    "wo_a": "attn.wo_a dequantized to BF16 at load (spec §2.4): "
            "BF16 size minus its FP8 weight + scale, split like wo_a",
    "window": "window ring: {window} tokens × {window_row} B per layer (incl. draft stages) per sequence",
    "compressed": "compressed KV: ⌈T/ratio⌉ rows × {compressed_row} B per KV-source layer per sequence",
    "index_keys": "index keys: ⌈T/ratio⌉ rows × {index_row} B per KV-source layer with an indexer per sequence",
    "working": "activations of one prefill step + logits + runtime reserve (formula below)",
}
KV_SPLIT = ("KV caches are replicated on every GPU: there is one KV head (MQA) and tensor-parallel attention "
            "splits the query heads, so every GPU reads the whole latent cache of every sequence "
            "(data-parallel attention would divide it by N instead).")
WORKING_FORMULA = (
    "S = batch × min(context, prefill_chunk) tokens in one prefill step; per GPU, bf16 unless stated:",
    "residual streams S·2·hc_mult·dim·2 B (mHC streams in and out)",
    "attention S·2·⌈n_heads/N⌉·head_dim·2 B (local queries and attention output)",
    "expert intermediates S·2·⌈(top_k + n_shared)·moe_inter_dim/N⌉·2 B (w1 and w3 outputs, tokens spread over N; "
    "n_shared alone with the routed experts on the host)",
    "index scores S·⌈context/r⌉·4 B (fp32 after the head-weighted sum; r = smallest ratio of a layer with an indexer)",
    "logits batch·P·⌈vocab/N⌉·4 B + the local LM head in fp32 ⌈vocab/N⌉·dim·4 B (P = DSpark block + 1, else 1)",
    "runtime reserve (CUDA context, communication buffers, allocator slack): a guess, --reserve",
    "the terms are summed: an upper bound, since they are not all live at once",
)
HOST_WORKING_FORMULA = (
    "with the routed experts on the host, host RAM also holds per prefill step (fp32, the CPU path at most):",
    "routed tokens in and out S·top_k·dim·4 B × 2 (the hidden states sent to the host and the weighted outputs)",
    "routed intermediates S·top_k·2·moe_inter_dim·4 B (w1 and w3 outputs)",
    "one expert matrix dequantized moe_inter_dim·dim·8 B (fp32 values and their cast copy; one matrix at a time)",
)


@dataclass(frozen=True)
class Hardware:
    gpus: int = 8
    gpu_mem_gib: float = 141.0
    host_mem_gib: float = 512.0
    context: int = 131072
    batch: int = 1
    prefill_chunk: int = 4096
    reserve_gib: float = 2.0
    experts: str = "device"   # where the routed experts live: EXPERT_PLACEMENTS

    def __post_init__(self) -> None:
        for name in ("gpus", "context", "batch", "prefill_chunk"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("gpu_mem_gib", "host_mem_gib"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.reserve_gib < 0:
            raise InputError(f"reserve_gib must be >= 0, got {self.reserve_gib!r}")
        if self.experts not in EXPERT_PLACEMENTS:
            raise InputError(f"experts must be one of {', '.join(EXPERT_PLACEMENTS)}, got {self.experts!r}")
        if self.experts == "host" and self.gpus != 1:
            raise InputError(f"routed experts on the host are planned for one GPU (the engine computes them in one "
                             f"process beside a single device), got {self.gpus} GPUs: use 1 GPU, or keep them on "
                             f"the devices")


@dataclass(frozen=True)
class Part:
    key: str
    label: str
    rule: str
    checkpoint: int          # bytes of its tensors in the checkpoint (0 for caches and buffers)
    gpu: tuple[int, ...]     # bytes resident on each GPU
    host: int = 0            # bytes placed on the host (Engram tables: mapped, not necessarily resident;
                             # routed experts placed on the host: resident)
    replicated: int = 0      # bytes of it that every GPU holds a copy of

    def to_json(self) -> dict:
        return {"key": self.key, "part": self.label, "rule": self.rule, "checkpoint_bytes": self.checkpoint,
                "gpu_bytes": list(self.gpu), "host_bytes": self.host, "replicated_bytes": self.replicated}


@dataclass(frozen=True)
class Verdict:
    device: str
    need: int
    capacity: int

    @property
    def fits(self) -> bool:
        return self.need <= self.capacity

    @property
    def text(self) -> str:
        need, cap = self.need / GIB, self.capacity / GIB
        shown = f"{need:.1f}" if need >= 1 else f"{need:.2g}"  # a tiny model still shows a non-zero need
        if self.fits:
            return f"fits: {shown} of {cap:g} GiB"
        return f"does not fit: needs {shown} GiB, has {cap:g} GiB ({need - cap:.1f} GiB short)"


def near_equal(n: int, parts: int) -> list[int]:
    """n split in `parts` near-equal integers: n//parts, plus one for the first n % parts."""
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def tensor_rule(name: str, experts: str = "device") -> tuple[str, str, int]:
    """(part, mode, dim) of one checkpoint tensor; mode is 'expert', 'split' (along dim), 'replicate' or 'host'.
    `experts` "host" sends the routed experts (of the backbone and of the drafter's stages) to the host."""
    part = kind_of(name)
    inner = kind_of("layers." + name.partition(".")[2]) if part == "drafter" else part  # a draft stage's own kind
    if inner == "routed_experts":
        return part, "host" if experts == "host" else "expert", 0
    if inner == "engram_tables":
        return part, "host", 0
    module = name.rsplit(".", 1)[0] if name.endswith((".weight", ".scale")) else name
    if inner in ("embedding", "head") or ".markov_head." in name:
        return part, "split", 0
    if module.endswith(("attn.wq_b", "attn.wo_a", "attn.attn_sink", "shared_experts.w1", "shared_experts.w3")):
        return part, "split", 0   # output rows: query heads, wo_a groups, shared-expert hidden units
    if module.endswith(("attn.wo_b", "shared_experts.w2")):
        return part, "split", 1   # input columns: row-parallel, one all-reduce after it
    return part, "replicate", 0


@lru_cache(maxsize=16)
def weight_parts(args: ModelArgs, gpus: int, experts: str = "device") -> tuple[Part, ...]:
    """Every checkpoint tensor (vision excluded) placed on `gpus` GPUs or the host, summed per part."""
    checkpoint: dict[str, int] = defaultdict(int)
    host: dict[str, int] = defaultdict(int)
    replicated: dict[str, int] = defaultdict(int)
    on_gpu: dict[str, list[int]] = defaultdict(lambda: [0] * gpus)
    for t in inventory_tuple(args):
        part, mode, dim = tensor_rule(t.name, experts)
        nbytes = t.nbytes
        checkpoint[part] += nbytes
        if mode == "host":
            host[part] += nbytes
        elif mode == "replicate":
            replicated[part] += nbytes
        elif mode == "expert":
            expert = int(t.name.split(".experts.", 1)[1].split(".", 1)[0])
            n_experts = args.draft_n_routed_experts if t.name.startswith("mtp.") else args.n_routed_experts
            on_gpu[part][expert * gpus // n_experts] += nbytes
        else:
            row = nbytes // t.shape[dim]  # bytes per slice along the split dimension
            for rank, share in enumerate(near_equal(t.shape[dim], gpus)):
                on_gpu[part][rank] += share * row
    parts = []
    for key in KINDS:
        if key == "vision" or not checkpoint[key]:
            continue
        gpu = tuple(b + replicated[key] for b in on_gpu[key])
        rule = (HOST_RULES if experts == "host" else RULES).get(key, RULES.get(key, REPLICATED))
        if key == "routed_experts" and experts == "device":
            rule += f" ({_per_gpu_count(args.n_routed_experts, gpus)} per layer)"
        parts.append(Part(key, LABELS[key], rule, checkpoint[key], gpu, host[key], replicated[key]))
    return tuple(parts)


def _per_gpu_count(n_experts: int, gpus: int) -> str:
    counts = near_equal(n_experts, gpus)
    each = str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    return f"{each} of {n_experts}"


@lru_cache(maxsize=16)
def wo_a_extra(args: ModelArgs, gpus: int) -> tuple[int, ...]:
    """Per GPU, the bytes a BF16 wo_a needs beyond its stored FP8 weight + scale (0 unless stored FP8)."""
    extra = [0] * gpus
    for t in inventory_tuple(args):
        if ".attn.wo_a." not in t.name or t.dtype not in ("F8_E4M3", "F8_E8M0"):
            continue
        row = t.nbytes // t.shape[0]
        sign = 1 if t.dtype == "F8_E4M3" else -1  # the weight goes from 1 B to 2 B per value; the scale is dropped
        for rank, share in enumerate(near_equal(t.shape[0], gpus)):
            extra[rank] += sign * share * row
    return tuple(extra)


def kv_bytes(args: ModelArgs, context: int, batch: int) -> dict[str, int]:
    """Exact cache bytes of `batch` sequences of `context` tokens, from the accounting's per-layer formats."""
    window = compressed = index_keys = 0
    for role, layer in zip(args.roles, account(args).layers):
        window += args.window_size * window_bytes(args)
        if layer.kv_compressed:
            compressed += ceil(context / role.ratio) * compressed_kv_bytes(args)
        if layer.kv_index:
            index_keys += ceil(context / role.ratio) * index_key_bytes(args)
    return {"window": batch * window, "compressed": batch * compressed, "index_keys": batch * index_keys}


def working_terms(args: ModelArgs, hw: Hardware) -> dict[str, int]:
    """Per-GPU activation and buffer estimate, term by term (WORKING_FORMULA)."""
    a, n = args, hw.gpus
    s = hw.batch * min(hw.context, hw.prefill_chunk)
    index_ratios = [r.ratio for r in a.roles if r.indexer != "none" and r.ratio]
    vocab_local = ceil(a.vocab_size / n)
    positions = a.dspark_block_size + 1 if a.has_dspark else 1
    experts_here = a.n_shared_experts + (a.n_activated_experts if hw.experts == "device" else 0)
    return {
        "residual streams": s * 2 * a.hc_mult * a.dim * 2,
        "attention": s * 2 * ceil(a.n_heads / n) * a.head_dim * 2,
        "expert intermediates": s * 2 * ceil(experts_here * a.moe_inter_dim / n) * 2,
        "index scores": s * ceil(hw.context / min(index_ratios)) * 4 if index_ratios else 0,
        "logits and fp32 head": hw.batch * positions * vocab_local * 4 + vocab_local * a.dim * 4,
        "runtime reserve": round(hw.reserve_gib * GIB),
    }


def host_working_terms(args: ModelArgs, hw: Hardware) -> dict[str, int]:
    """Host buffers of the routed experts computed on the CPU, term by term (HOST_WORKING_FORMULA); none when
    the experts are on the devices."""
    if hw.experts != "host":
        return {}
    a, s = args, hw.batch * min(hw.context, hw.prefill_chunk)
    return {"routed tokens in and out": s * a.n_activated_experts * a.dim * 4 * 2,
            "routed intermediates": s * a.n_activated_experts * 2 * a.moe_inter_dim * 4,
            "one dequantized expert matrix": a.moe_inter_dim * a.dim * 8}


@lru_cache(maxsize=16)
def host_tensor_sizes(args: ModelArgs, experts: str = "device") -> tuple[tuple[int, ...], int]:
    """(bytes of each Engram table tensor, left on the host and read by rows; bytes of the largest tensor that
    goes to a GPU)."""
    tables, largest = [], 0
    for t in inventory_tuple(args):
        part, mode, _ = tensor_rule(t.name, experts)
        if mode != "host":
            largest = max(largest, t.nbytes)
        elif part == "engram_tables":
            tables.append(t.nbytes)
    return tuple(tables), largest


def engram_touched(args: ModelArgs, context: int, batch: int) -> int:
    """Upper bound of the host RAM the Engram gathers touch: one page per row read, at most each whole tensor."""
    rows = batch * context * args.engram_n_columns  # rows read per Engram layer over the whole context
    return sum(min(rows * PAGE, nbytes) for nbytes in host_tensor_sizes(args)[0])


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    hardware: Hardware
    weights: tuple[Part, ...]
    runtime: tuple[Part, ...]
    working: dict
    gpus: tuple[Verdict, ...]
    host: Verdict
    engram_mapped: int       # Engram table bytes left in the shard files on the host (the whole tables)
    engram_touched: int      # bound of the RAM their gathers touch for this context and batch
    staging: int             # host buffer while loading: twice the largest tensor placed on a GPU
    notes: tuple[str, ...]
    experts_on_host: int = 0                 # routed-expert bytes resident in host RAM (experts "host")
    host_working: dict | None = None         # host buffers of the CPU-computed experts (HOST_WORKING_FORMULA)

    @property
    def page_cache_room(self) -> int:
        """Host RAM left for the Engram tables' page cache: capacity minus everything else the host holds (the
        touched pages are pages of the tables, so they are not counted twice)."""
        return self.host.capacity - (self.host.need - self.engram_touched)

    @property
    def engram_cached(self) -> bool:
        """Whether the whole Engram tables fit in the page cache beside the rest of host RAM's load."""
        return self.engram_mapped <= self.page_cache_room

    @property
    def checkpoint_bytes(self) -> int:
        return sum(p.checkpoint for p in self.weights)

    @property
    def weights_on_host(self) -> int:
        return sum(p.host for p in self.weights)

    @property
    def weights_replicated(self) -> int:
        """Bytes of the tensors every GPU holds a copy of (counted once)."""
        return sum(p.replicated for p in self.weights)

    @property
    def weights_on_gpus(self) -> int:
        """Checkpoint bytes on the GPUs with each tensor counted once (a replicated one is not counted N times)."""
        return sum(sum(p.gpu) - (self.hardware.gpus - 1) * p.replicated for p in self.weights)

    @property
    def fits(self) -> bool:
        return self.host.fits and all(v.fits for v in self.gpus)

    def summary(self) -> str:
        hw, worst = self.hardware, max(self.gpus, key=lambda v: v.need)
        verdict = "fits" if self.fits else "does not fit"
        where = ", routed experts in host RAM," if hw.experts == "host" else ""
        return (f"{self.model} at {context_label(hw.context)} context × batch {hw.batch} on {hw.gpus} × "
                f"{hw.gpu_mem_gib:g} GiB{where} needs "
                f"{worst.need / GIB:.1f} GiB per GPU (max) and {self.host.need / GIB:.1f} GiB host RAM, with "
                f"{self.engram_mapped / GIB:.1f} GiB of Engram tables read from the shards: {verdict}")

    def to_json(self) -> dict:
        hw = self.hardware
        return {
            "model": self.model, "summary": self.summary(), "fits": self.fits,
            "hardware": {"gpus": hw.gpus, "gpu_mem_gib": hw.gpu_mem_gib, "host_mem_gib": hw.host_mem_gib,
                         "context": hw.context, "batch": hw.batch, "prefill_chunk": hw.prefill_chunk,
                         "reserve_gib": hw.reserve_gib, "experts": hw.experts},
            "checkpoint_bytes": self.checkpoint_bytes, "weights_on_gpus_bytes": self.weights_on_gpus,
            "weights_on_host_bytes": self.weights_on_host, "weights_replicated_bytes": self.weights_replicated,
            "weights": [p.to_json() for p in self.weights], "runtime": [p.to_json() for p in self.runtime],
            "working_bytes_per_gpu": dict(self.working), "working_formula": list(WORKING_FORMULA),
            "devices": [{"device": v.device, "need_bytes": v.need, "capacity_bytes": v.capacity, "fits": v.fits,
                         "verdict": v.text} for v in (*self.gpus, self.host)],
            "engram": {"mapped_bytes": self.engram_mapped, "touched_bytes_bound": self.engram_touched,
                       "page_cache_room_bytes": self.page_cache_room, "tables_fit_in_page_cache": self.engram_cached},
            "experts_on_host_bytes": self.experts_on_host, "host_working_bytes": dict(self.host_working or {}),
            "loading_staging_bytes": self.staging, "kv_split": KV_SPLIT, "notes": list(self.notes),
        }


def context_label(tokens: int) -> str:
    """128k for 131,072 tokens, 1M for 1,048,576; other counts with thousands separators."""
    if tokens % 2**20 == 0:
        return f"{tokens // 2**20}M"
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else f"{tokens:,}"


def memory_plan(args: ModelArgs, hw: Hardware = Hardware()) -> MemoryPlan:
    """Place the config's checkpoint, caches and buffers on hw.gpus GPUs and the host, and judge each device."""
    n = hw.gpus
    weights = weight_parts(args, n, hw.experts)
    kv = kv_bytes(args, hw.context, hw.batch)
    working = working_terms(args, hw)
    runtime = [Part("wo_a", "wo_a as BF16", RUNTIME_RULES["wo_a"], 0, wo_a_extra(args, n))] \
        if args.dtype == "fp8" else []
    rows = {"window": args.window_size, "window_row": window_bytes(args), "compressed_row": compressed_kv_bytes(args),
            "index_row": index_key_bytes(args)}
    for key, label in (("window", "window rings"), ("compressed", "compressed KV"), ("index_keys", "index keys")):
        if kv[key]:
            runtime.append(Part(key, label, RUNTIME_RULES[key].format(**rows), 0, (kv[key],) * n, replicated=kv[key]))
    runtime.append(Part("working", "working buffers", RUNTIME_RULES["working"], 0, (sum(working.values()),) * n))
    capacity = round(hw.gpu_mem_gib * GIB)
    gpus = tuple(Verdict(f"GPU {r}", sum(p.gpu[r] for p in (*weights, *runtime)), capacity) for r in range(n))
    mapped = sum(p.host for p in weights if p.key == "engram_tables")
    experts_on_host = sum(p.host for p in weights if p.key != "engram_tables")
    host_working = host_working_terms(args, hw)
    touched = engram_touched(args, hw.context, hw.batch)
    staging = 2 * host_tensor_sizes(args, hw.experts)[1]
    host = Verdict("host", experts_on_host + sum(host_working.values()) + touched + staging,
                   round(hw.host_mem_gib * GIB))
    notes = [KV_SPLIT, "vision tensors are not placed: the engine does not run the vision tower"]
    uneven = uneven_counts(args, n)
    if uneven:
        notes.append(f"the engine's parallel layout cannot split this config over {n} GPUs: {', '.join(uneven)} "
                     f"must each be divisible by the GPU count (the bytes above assume near-equal blocks)")
    if experts_on_host:
        notes.append(f"routed experts ({experts_on_host / GIB:.1f} GiB, the backbone's and the drafter's) stay in "
                     f"host RAM as stored and are computed on the CPU: each step sends only the routed tokens' "
                     f"hidden states across PCIe, not the weights; host expert buffers "
                     f"{sum(host_working.values()) / GIB:.2f} GiB (formula below)")
    plan = MemoryPlan(args.name or "model", hw, weights, tuple(runtime), working, gpus, host, mapped, touched,
                      staging, (), experts_on_host, host_working)
    if mapped:
        room = plan.page_cache_room
        beside = "in the page cache beside the rest of the host's load"
        cached = (f"fit {beside} ({room / GIB:.1f} GiB left for them)" if plan.engram_cached
                  else f"do not fit {beside} (only {max(room, 0) / GIB:.1f} GiB left for them): rows not read "
                       f"lately are evicted and read again from the shard files (correct, slower)")
        notes.append(f"Engram tables ({mapped / GIB:.1f} GiB) stay in the shard files: each forward reads only the "
                     f"rows its tokens hash to, so the pages it touches (≤ {touched / GIB:.1f} GiB at this context "
                     f"and batch) are counted as host RAM; the whole tables {cached}")
    if args.max_position_embeddings and hw.context > args.max_position_embeddings:
        notes.append(f"context {hw.context:,} exceeds the config's max_position_embeddings "
                     f"{args.max_position_embeddings:,}")
    return replace(plan, notes=tuple(notes))
