"""Throughput benchmark: prefill and decode tokens/s, and the Trace's overhead, measured in one run."""
from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict, dataclass

import torch

from .config import ModelArgs
from .generate import generate
from .trace import Trace, TraceBudget


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
    prefill_tokens_per_s: float         # median over repeats, no trace
    decode_tokens_per_s: float          # median over repeats, no trace (all rows together)
    traced_prefill_tokens_per_s: float
    traced_decode_tokens_per_s: float
    trace_overhead_prefill: float       # traced time / untraced time (1.0 = free)
    trace_overhead_decode: float
    trace_records: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [f"{self.config} on {self.device} ({self.machine}, {self.threads} torch threads); batch {self.batch}, "
                f"prompt {self.prompt_len}, {self.new_tokens} new tokens, median of {self.repeats}",
                f"  prefill {self.prefill_tokens_per_s:10,.1f} tokens/s   traced {self.traced_prefill_tokens_per_s:10,.1f}"
                f"   overhead x{self.trace_overhead_prefill:.2f}",
                f"  decode  {self.decode_tokens_per_s:10,.1f} tokens/s   traced {self.traced_decode_tokens_per_s:10,.1f}"
                f"   overhead x{self.trace_overhead_decode:.2f}"]


def machine_description(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def run_bench(args: ModelArgs, *, batch: int = 1, prompt_len: int = 64, new_tokens: int = 32, repeats: int = 3,
              seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32, options=None,
              budget: TraceBudget | None = None) -> BenchResult:
    """Random-init model, random prompts, greedy decode with no stop token. Untraced and traced runs
    alternate, so both see the same machine state; the overhead is the ratio of their median times."""
    from .model import Transformer, init_weights
    if prompt_len < 1 or new_tokens < 2 or repeats < 1 or batch < 1:
        raise ValueError("bench needs batch >= 1, prompt_len >= 1, new_tokens >= 2 and repeats >= 1")
    if prompt_len + new_tokens > args.max_seq_len:
        raise ValueError(f"bench: prompt_len + new_tokens = {prompt_len + new_tokens} exceeds the model's "
                         f"max_seq_len of {args.max_seq_len}")
    token_map = None
    if args.has_engram:  # a synthetic map keeps the bench independent of the tokenizer files
        token_map = torch.arange(args.vocab_size).remainder(args.engram_compressed_vocab_size).numpy()
    model = Transformer(args, token_map, dtype=dtype, device=device, options=options)
    init_weights(model, seed)
    model.eval()
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, args.vocab_size, (batch, prompt_len), generator=g).tolist()
    runs: dict[bool, list] = {False: [], True: []}
    records: dict = {}
    generate(model, prompts, max_new_tokens=2, stop_tokens=())  # warm-up (allocations, lazy init)
    for _ in range(repeats):
        for traced in (False, True):
            trace = Trace(budget or TraceBudget(max_tokens=None)) if traced else None
            res = generate(model, prompts, max_new_tokens=new_tokens, stop_tokens=(), trace=trace)
            runs[traced].append((res.prefill_s, res.decode_s))
            if trace is not None:
                records = trace.summary()["records"]
    prefill = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    decode = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
    decoded = batch * (new_tokens - 1)  # the first new token of each row comes from prefill
    return BenchResult(
        config=args.name or "model", device=str(device), machine=machine_description(str(device)),
        threads=torch.get_num_threads(), batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        repeats=repeats, prefill_tokens_per_s=batch * prompt_len / prefill[False],
        decode_tokens_per_s=decoded / decode[False], traced_prefill_tokens_per_s=batch * prompt_len / prefill[True],
        traced_decode_tokens_per_s=decoded / decode[True], trace_overhead_prefill=prefill[True] / prefill[False],
        trace_overhead_decode=decode[True] / decode[False], trace_records=records)
