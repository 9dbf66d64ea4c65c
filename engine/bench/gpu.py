"""GPU benchmark section: per-kernel time vs PyTorch, launches per decode step, decode tokens/s, and the floor."""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile

from ..graphs import GraphedDecoder
from ..kernels import launch
from ..kernels.runtime import interpreting, require
from ..model import Transformer, init_weights
from ..model.engram import Engram
from ..model.mhc import collapse, expand, hc_mixes
from ..model.moe import MoE
from ..spec.config import ModelArgs
from ..speedups import apply_kernels, prepare_for_inference
from ..speedups.fast_moe import FastMoE
from .cpu import bench_model
from .machine import machine_description


@dataclass
class KernelTiming:
    kernel: str
    tokens: int
    torch_ms: float
    triton_ms: float

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.triton_ms if self.triton_ms > 0 else float("nan")


@dataclass
class GpuBenchResult:
    config: str
    device: str
    machine: str
    interpreted: bool                     # True: TRITON_INTERPRET on CPU, a smoke run whose times mean nothing
    kernel_shapes: str                    # which config's widths the per-kernel timings use
    kernels: list[KernelTiming] = field(default_factory=list)
    launches_torch: int | None = None     # CUDA kernels per decode step (torch.profiler), None on CPU
    launches_triton: int | None = None
    decode_tokens_per_s_torch: float = 0.0
    decode_tokens_per_s_triton: float = 0.0
    # decode steps through engine.graphs.GraphedDecoder: captured CUDA graphs on a GPU, eager replay on CPU
    decode_tokens_per_s_graphs: float = 0.0
    decode_tokens_per_s_triton_graphs: float = 0.0
    graphs_captured: bool = False         # False: the graphed rows are eager replays (no CUDA)
    weight_bytes_per_step: int = 0        # parameters a batch-1 decode step reads (routed: k experts per layer)
    bandwidth_gb_s: float | None = None   # measured device-to-device copy bandwidth
    launch_overhead_us: float | None = None
    floor_ms: float | None = None         # bytes / bandwidth + launches × overhead (the faster variant's launches)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, t in zip(d["kernels"], self.kernels):
            k["speedup"] = t.speedup
        return d

    def lines(self) -> list[str]:
        head = "INTERPRETER SMOKE RUN (CPU): times below are not performance" if self.interpreted else self.machine
        out = [f"GPU section: {self.config} on {self.device} ({head}); kernel shapes from {self.kernel_shapes}",
               f"  {'kernel':<32}{'tokens':>7}{'torch ms':>11}{'triton ms':>11}{'speedup':>9}"]
        out += [f"  {t.kernel:<32}{t.tokens:>7}{t.torch_ms:>11.4f}{t.triton_ms:>11.4f}{t.speedup:>8.2f}x"
                for t in self.kernels]
        if self.launches_torch is not None:
            out.append(f"  kernel launches per decode step: torch {self.launches_torch}, triton {self.launches_triton}")
        out.append(f"  decode tokens/s: torch {self.decode_tokens_per_s_torch:,.1f}, "
                   f"triton kernels {self.decode_tokens_per_s_triton:,.1f}")
        how = "CUDA graphs" if self.graphs_captured else "static body, eager replay (no CUDA graphs here)"
        out.append(f"  decode tokens/s with {how}: torch {self.decode_tokens_per_s_graphs:,.1f}, "
                   f"triton kernels {self.decode_tokens_per_s_triton_graphs:,.1f}")
        if self.floor_ms is not None:
            out.append(f"  floor per step {self.floor_ms:.3f} ms = "
                       f"{self.weight_bytes_per_step / 1e6:,.1f} MB weights at "
                       f"{self.bandwidth_gb_s:,.0f} GB/s + launches × {self.launch_overhead_us:.1f} µs")
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of fn() in ms after one warm-up call (which also compiles a Triton kernel)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_timings(args: ModelArgs, device: torch.device, tokens: tuple[int, ...], repeats: int,
                   dtype: torch.dtype) -> list[KernelTiming]:
    """Each kernel against the PyTorch module code it replaces, on random inputs at the config's widths."""
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dt)

    hc, D, mix = args.hc_mult, args.dim, args.hc_mix_dim
    fn, scale, base = rnd(mix, hc * D, scale=0.1 * (hc * D) ** -0.5, dt=torch.float32), \
        torch.ones(3, device=device), rnd(mix, scale=0.5, dt=torch.float32)
    eps = dict(iters=args.hc_sinkhorn_iters, hc_eps=args.hc_eps, norm_eps=args.norm_eps)
    ns = SimpleNamespace(dim=D, moe_inter_dim=args.moe_inter_dim, swiglu_limit=args.swiglu_limit,
                         route_scale=args.route_scale, gate_temp=args.gate_temp, norm_topk_prob=args.norm_topk_prob,
                         hc_mult=hc, norm_eps=args.norm_eps, engram_layer_ids=[0],
                         engram_head_dim=args.engram_head_dim, engram_n_columns=args.engram_n_columns)
    E, k = args.n_routed_experts, args.n_activated_experts
    moe = FastMoE.adopt(MoE(ns, E, k, dtype=dtype, device=device).requires_grad_(False))
    for p in moe.parameters():
        p.copy_(rnd(*p.shape, scale=p.shape[-1] ** -0.5, dt=p.dtype))
    rows = 4096
    engram = Engram(ns, 0, rows, dtype=dtype, device=device).requires_grad_(False) if args.has_engram else None
    if engram is not None:
        for p in engram.parameters():
            p.copy_(rnd(*p.shape, scale=p.shape[-1] ** -0.5, dt=p.dtype))
    w1, w2, w3 = moe.stacked()
    out = []
    for n in tokens:
        x = rnd(1, n, hc, D)
        f = rnd(1, n, D)
        carry = torch.softmax(rnd(1, n, hc, dt=torch.float32), -1)
        pre, post, comb = hc_mixes(x, fn, scale, base, eps["iters"], eps["hc_eps"], eps["norm_eps"])

        def seam_torch():
            x2 = expand(f, x, post, comb)
            hc_mixes(x2, fn, scale, base, eps["iters"], eps["hc_eps"], eps["norm_eps"])
            return collapse(x2, carry)

        flat = rnd(n, D)
        weights, ids, _ = moe.gate(flat)
        moe_ref = moe.gathered_experts if n * k <= E else partial(MoE.routed_experts, moe)   # sorted reference
        cases = [("mhc seam (expand+mix+collapse)", seam_torch,
                  lambda: launch.mhc_seam(x, f=f, post_in=post, comb_in=comb, carry=carry, fn=fn, scale=scale,
                                          base=base, **eps)),
                 ("router", lambda: moe.gate(flat),
                  lambda: launch.route(flat, moe.gate.weight, moe.gate.bias, topk=k, temp=args.gate_temp,
                                       route_scale=args.route_scale, normalize=args.norm_topk_prob)),
                 ("moe routed experts", lambda: moe_ref(flat, weights, ids),
                  lambda: launch.moe_experts(flat, weights, ids, w1, w2, w3, limit=args.swiglu_limit))]
        if engram is not None:
            ids_e = torch.randint(0, rows, (1, n, args.engram_n_columns), generator=g, device=device)

            def engram_triton():
                kv = engram.wkv(launch.engram_gather(engram.embed.weight, ids_e))
                return launch.engram_gate_add(x, kv, engram.q_weight, engram.k_weight, eps=args.norm_eps)

            cases.append(("engram (gather+wkv+gate)", lambda: engram(x, ids_e, None), engram_triton))
        for name, ref, fast in cases:
            out.append(KernelTiming(name, n, _time_ms(ref, device, repeats), _time_ms(fast, device, repeats)))
    return out


def count_launches(model, tokens: torch.Tensor, cache) -> int:
    """CUDA kernels one decode step launches, counted by torch.profiler (CUPTI)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(tokens, cache)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def decode_rate(model, batch: int, prompt_len: int, steps: int, device: torch.device, graphs: bool = False):
    """Greedy decode tokens/s (median step) after a prefill → (rate, the cache, the next tokens [B, 1]).
    graphs: decode through a GraphedDecoder (its first step, which captures, is one of the steps; the median
    leaves it out once steps ≥ 3)."""
    # with graphs, one extra cache row takes a bucket's padding rows
    cache = model.new_cache(batch + 1 if graphs else batch, prompt_len + steps + 2)
    step = model
    if graphs:
        decoder = GraphedDecoder(model, cache, scratch_row=batch)
        rows = list(range(batch))

        def step(tokens, _cache):
            return decoder.step(tokens, rows)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, model.args.vocab_size, (batch, prompt_len), generator=g).to(device)
    times = []
    out = model(tokens, cache, rows=list(range(batch))).logits
    for _ in range(steps):
        tokens = out.argmax(-1, keepdim=True)
        _sync(device)
        t0 = time.perf_counter()
        out = step(tokens, cache).logits
        _sync(device)
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times), cache, out.argmax(-1, keepdim=True)


def weight_bytes_per_step(model) -> int:
    """Bytes of parameters a batch-1 decode step reads: all but routed experts and embedding tables, plus k
    routed experts per MoE, one embedding row and the Engram rows (negligible, left out)."""
    total = 0
    for name, p in model.named_parameters():
        if ".experts." in name or name.endswith("embed.weight"):
            continue
        total += p.numel() * p.element_size()
    for m in model.modules():
        if isinstance(m, MoE):
            e = m.experts[0]
            total += m.topk * sum(w.weight.numel() * w.weight.element_size() for w in (e.w1, e.w2, e.w3))
    return total


def measure_bandwidth(device: torch.device) -> tuple[float, float]:
    """(GB/s of a 1 GiB device copy, counting read + write; µs per launch of a one-element add)."""
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    ms = _time_ms(lambda: b.copy_(a), device, 5)
    t = torch.zeros(1, device=device)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(1000):
        t.add_(1)
    _sync(device)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9, (time.perf_counter() - t0) * 1e3


def run_gpu_bench(args: ModelArgs, *, kernel_args: ModelArgs | None = None, device: str = "cuda", batch: int = 1,
                  prompt_len: int = 16, steps: int = 16, repeats: int = 20, tokens: tuple[int, ...] = (1, 64),
                  dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> GpuBenchResult:
    """`args` builds the decode model (random weights); `kernel_args` (default: args) gives the widths of
    the per-kernel timings, so full V4.1-Flash shapes can be timed without building the full model."""
    dev = torch.device(device)
    require(dev)
    interpreted = dev.type == "cpu"
    if interpreted:  # a smoke run of every code path: the interpreter runs ~0.1 s per program
        dtype = torch.float32 if dtype == torch.bfloat16 else dtype    # its bf16 tl.dot is wrong
        tokens, steps, repeats = tokens[:1], min(steps, 2), 1
    kargs = kernel_args or args
    with torch.no_grad():  # not inference_mode: FastMoE.stacked() reads parameter version counters
        kernels = kernel_timings(kargs, dev, tokens, repeats, dtype)
        token_map = torch.arange(args.vocab_size).remainder(args.engram_compressed_vocab_size).numpy() \
            if args.has_engram else None
        model = prepare_for_inference(Transformer(args, token_map, dtype=dtype, device=dev))
        init_weights(model, seed)
        model.eval()
        result = GpuBenchResult(config=args.name or "model", device=str(dev), machine=machine_description(str(dev)),
                                interpreted=interpreted and interpreting(), kernel_shapes=kargs.name or "model",
                                kernels=kernels, weight_bytes_per_step=weight_bytes_per_step(model))
        rate_t, cache, nxt = decode_rate(model, batch, prompt_len, steps, dev)
        if dev.type == "cuda":
            result.launches_torch = count_launches(model, nxt, cache)
        result.decode_tokens_per_s_graphs = decode_rate(model, batch, prompt_len, steps, dev, graphs=True)[0]
        result.graphs_captured = dev.type == "cuda"
        apply_kernels(model, "triton")
        result.decode_tokens_per_s_triton_graphs = decode_rate(model, batch, prompt_len, steps, dev, graphs=True)[0]
        rate_k, cache, nxt = decode_rate(model, batch, prompt_len, steps, dev)
        if dev.type == "cuda":
            result.launches_triton = count_launches(model, nxt, cache)
            bw, launch_us = measure_bandwidth(dev)
            launches = min(result.launches_torch, result.launches_triton)
            result.bandwidth_gb_s, result.launch_overhead_us = bw, launch_us
            result.floor_ms = result.weight_bytes_per_step / (bw * 1e9) * 1e3 + launches * launch_us * 1e-3
        result.decode_tokens_per_s_torch, result.decode_tokens_per_s_triton = rate_t, rate_k
    return result


def graph_decode_rates(args: ModelArgs, *, batch: int, prompt_len: int, steps: int, seed: int = 0,
                       device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """`bench --cuda-graphs`: greedy decode tokens/s of one random-init model, plain forward vs GraphedDecoder
    (captured CUDA graphs on a GPU; on the CPU an eager replay of the static body, so no speed-up is expected)."""
    dev = torch.device(device)
    model = bench_model(args, batch=batch, prompt_len=prompt_len, new_tokens=steps + 2, repeats=1, seed=seed,
                        device=device, dtype=dtype)
    with torch.no_grad():
        plain = decode_rate(model, batch, prompt_len, steps, dev)[0]
        graphed = decode_rate(model, batch, prompt_len, steps, dev, graphs=True)[0]
    return {"decode_tokens_per_s": plain, "decode_tokens_per_s_graphs": graphed, "captured": dev.type == "cuda"}


def graph_rate_lines(rates: dict) -> list[str]:
    how = "CUDA graphs" if rates["captured"] else "GraphedDecoder eager replay (no CUDA here)"
    return [f"decode tokens/s: plain {rates['decode_tokens_per_s']:,.1f}, "
            f"{how} {rates['decode_tokens_per_s_graphs']:,.1f}"]
