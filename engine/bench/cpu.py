"""Throughput benchmark: prefill and decode tokens/s, and the Trace's overhead, measured in one run."""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..graphs import GraphedDecoder
from ..model import init_weights
from ..parallel import shard_for_launch
from ..placement import build_model, prepare_model
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..trace import Trace, TraceBudget
from .machine import machine_description


@dataclass
class BenchResult:
    config: str
    device: str
    machine: str
    threads: int
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int
    dtype: str                          # the model's parameter dtype: float32, bfloat16, float64
    prefill_tokens_per_s: float         # median prefill forward, no trace
    decode_tokens_per_s: float          # median decode step (all rows together), no trace
    traced_prefill_tokens_per_s: float
    traced_decode_tokens_per_s: float
    trace_overhead_prefill: float       # median traced / untraced time of paired forwards (1.0 = free)
    trace_overhead_decode: float
    trace_records: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [f"{self.config} on {self.device} ({self.machine}, {self.threads} torch threads); batch {self.batch}, "
                f"prompt {self.prompt_len}, {self.new_tokens} new tokens, {self.dtype}, median of {self.repeats}",
                f"  prefill {self.prefill_tokens_per_s:10,.1f} tokens/s   "
                f"traced {self.traced_prefill_tokens_per_s:10,.1f}   overhead x{self.trace_overhead_prefill:.2f}",
                f"  decode  {self.decode_tokens_per_s:10,.1f} tokens/s   "
                f"traced {self.traced_decode_tokens_per_s:10,.1f}   overhead x{self.trace_overhead_decode:.2f}"]


def check_sizes(args: ModelArgs, *, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> None:
    if prompt_len < 1 or new_tokens < 2 or repeats < 1 or batch < 1:
        raise InputError("bench needs batch >= 1, prompt_len >= 1, new_tokens >= 2 and repeats >= 1")
    if prompt_len + new_tokens > args.max_seq_len:
        raise InputError(f"bench: prompt_len + new_tokens = {prompt_len + new_tokens} exceeds the model's "
                         f"max_seq_len of {args.max_seq_len}")


def bench_model(args: ModelArgs, *, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int,
                device: str, dtype: torch.dtype, options=None):
    """Check the bench sizes, then build a seeded random-init model in eval mode."""
    check_sizes(args, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats)
    token_map = None
    if args.has_engram:  # a synthetic map keeps the bench independent of the tokenizer files
        token_map = torch.arange(args.vocab_size).remainder(args.engram_compressed_vocab_size).numpy()
    model = prepare_model(build_model(args, token_map, dtype=dtype, device=device, options=options))   # experts placed
    init_weights(model, seed)
    return shard_for_launch(model).eval()  # under torchrun: this rank's shard (engine.parallel)

def run_bench(args: ModelArgs, *, batch: int = 1, prompt_len: int = 64, new_tokens: int = 32, repeats: int = 3,
              seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32, options=None,
              budget: TraceBudget | None = None, model=None) -> BenchResult:
    """Random-init model (or `model`, a built one of these args: the shipped checkpoint, say), random prompts, one
    prefill then new_tokens − 1 greedy decode steps, each done twice (no trace / trace) on two caches. Tokens/s
    are medians per forward; the overhead is the median ratio of traced to untraced time over the back-to-back
    pairs. The default budget is the Inspect page's (every layer, attention facts, top-5 logits, the logit lens),
    and a traced forward includes each row's token record (the lens's head matmuls come once, when the trace is
    first read: not per step)."""
    if model is None:
        model = bench_model(args, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                            seed=seed, device=device, dtype=dtype, options=options)
    check_sizes(args, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, args.vocab_size, (batch, prompt_len), generator=g).tolist()
    prefill = {False: [], True: []}
    decode = {False: [], True: []}
    records: dict = {}
    with torch.inference_mode():
        _timed(model, torch.tensor(prompts, device=device)[:, :2], model.new_cache(batch), None)  # warm-up
        for rep in range(repeats):
            trace = Trace(budget or TraceBudget(max_tokens=None, attention=True, lens=True))
            caches = {False: model.new_cache(batch, prompt_len + new_tokens),
                      True: model.new_cache(batch, prompt_len + new_tokens)}
            tokens = torch.tensor(prompts, device=device)  # [B, prompt_len]
            # Untraced and traced forwards alternate call by call (and swap order each time), so a busy
            # machine slows both alike and the overhead ratio stays meaningful.
            for i in range(new_tokens):
                order = (False, True) if (rep + i) % 2 == 0 else (True, False)
                out = {}
                for traced in order:
                    dt, out[traced] = _timed(model, tokens, caches[traced], trace if traced else None,
                                             (i, prompt_len + i))
                    (prefill if i == 0 else decode)[traced].append(dt)
                if not torch.equal(out[False], out[True]):
                    raise RuntimeError("bench: traced and untraced logits differ; the trace changed the computation")
                tokens = out[False].argmax(-1, keepdim=True)  # [B, 1] greedy next token
            records = trace.summary()["records"]
    pre = {k: statistics.median(v) for k, v in prefill.items()}
    dec = {k: statistics.median(v) for k, v in decode.items()}
    # overhead: median over back-to-back (untraced, traced) pairs of their time ratio; a median of
    # pair ratios resists the bursts of load that a shared machine adds to single calls
    over_pre = statistics.median(t / u for u, t in zip(prefill[False], prefill[True]))
    over_dec = statistics.median(t / u for u, t in zip(decode[False], decode[True]))
    return BenchResult(
        config=args.name or "model", device=str(device), machine=machine_description(str(device)),
        threads=torch.get_num_threads(), batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        repeats=repeats, dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        prefill_tokens_per_s=batch * prompt_len / pre[False], decode_tokens_per_s=batch / dec[False],
        traced_prefill_tokens_per_s=batch * prompt_len / pre[True], traced_decode_tokens_per_s=batch / dec[True],
        trace_overhead_prefill=over_pre, trace_overhead_decode=over_dec, trace_records=records)


def _timed(model, tokens, cache, trace, step_pos=(0, 0)) -> tuple[float, torch.Tensor]:
    """Seconds of one forward (with a trace: and the token record generation adds per row, given the row's
    logits [V] and its greedy token, which both sides pick untimed) and its logits [B, V]."""
    device = tokens.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = model(tokens, cache, trace=trace, logits="last").logits                  # [B, V]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    if trace is not None:
        step, pos = step_pos
        chosen = out.argmax(-1).tolist()
        t0 = time.perf_counter()
        for row, logits in enumerate(out):  # top-k logits and the greedy token's log-probability
            trace.record_token(row, pos, chosen[row], "", step=step, step_time_s=0.0, logits=logits)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds += time.perf_counter() - t0
    return seconds, out


def compiled_decode_rates(args: ModelArgs, *, batch: int = 1, prompt_len: int = 32, steps: int = 31, seed: int = 0,
                          device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """`bench --compile`: greedy decode of one random-init model, the eager forward against the static decode
    body run through torch.compile (engine.graphs.GraphedDecoder(compile=True)) on the same tokens: median
    step tokens/s of each, the seconds the first compiled step took (tracing and compiling; inductor's cache
    on disk shortens it in later processes) and the largest logit difference between the two. The eager steps run
    first and the compiled steps then back to back, as each runs in a generation (a compiled step between eager
    ones would find the caches holding what the eager step read: in bf16 both the weights and their fp32 copies)."""
    model = bench_model(args, batch=batch, prompt_len=prompt_len, new_tokens=steps + 1, repeats=1, seed=seed,
                        device=device, dtype=dtype)
    prompts = torch.randint(3, args.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    rows = list(range(batch))
    with torch.inference_mode():
        eager_cache = model.new_cache(batch, prompt_len + steps + 1)
        graph_cache = model.new_cache(batch + 1, prompt_len + steps + 1)   # + the padding rows' scratch row
        decoder = GraphedDecoder(model, graph_cache, scratch_row=batch, compile=True)
        out = model(prompts.to(device), eager_cache).logits
        model(prompts.to(device), graph_cache, rows=rows)
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        fed, eager_logits = [], []
        for _ in range(steps):
            tokens = out.argmax(-1, keepdim=True)                                 # [B, 1] eager greedy
            t0 = time.perf_counter()
            out = model(tokens, eager_cache).logits
            times["eager"].append(time.perf_counter() - t0)
            fed.append(tokens.cpu())
            eager_logits.append(out)
        diff = 0.0
        for tokens, eager in zip(fed, eager_logits):
            t0 = time.perf_counter()
            compiled = decoder.step(tokens, rows).logits
            times["compiled"].append(time.perf_counter() - t0)
            diff = max(diff, float((compiled.to(eager.device) - eager).abs().max()))
    compile_s = times["compiled"].pop(0)                                          # tracing and compiling
    return {"decode_tokens_per_s": batch / statistics.median(times["eager"][1:]),
            "decode_tokens_per_s_compiled": batch / statistics.median(times["compiled"]),
            "first_compiled_step_s": compile_s, "max_logit_difference": diff}


def compiled_rate_lines(rates: dict) -> list[str]:
    return [f"decode tokens/s: eager {rates['decode_tokens_per_s']:,.1f}, torch.compile "
            f"{rates['decode_tokens_per_s_compiled']:,.1f} (first step, compiling: "
            f"{rates['first_compiled_step_s']:,.1f} s; logits within {rates['max_logit_difference']:.1e})"]
