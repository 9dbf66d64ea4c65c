"""DSpark on/off benchmark: greedy decode tokens/s with and without speculation, measured in one run."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace

import torch

from ..generation import DSparkConfig, Engine
from ..request import GenerationRequest
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from .cpu import bench_model


@dataclass
class DSparkBenchResult:
    config: str
    schedule: str
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int
    threads: int
    plain_tokens_per_s: float        # median over repeats of decode tokens/s, DSpark off
    dspark_tokens_per_s: float       # the same with DSpark on
    speedup: float                   # median of the per-repeat ratios on / off
    tokens_per_target_forward: float  # committed tokens per decode-time target forward (all rows)
    mean_accepted_length: float      # per request-step, bonus included
    acceptance_rate: float
    outputs_equal: bool              # greedy outputs identical with DSpark on and off

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [f"DSpark ({self.schedule}) vs plain greedy decode: batch {self.batch}, prompt {self.prompt_len}, "
                f"{self.new_tokens} new tokens, median of {self.repeats}, {self.threads} torch threads",
                f"  off {self.plain_tokens_per_s:10,.1f} tokens/s   on {self.dspark_tokens_per_s:10,.1f} tokens/s   "
                f"ratio x{self.speedup:.2f}",
                f"  {self.tokens_per_target_forward:.3f} tokens per target forward, mean accepted length "
                f"{self.mean_accepted_length:.3f}, acceptance rate {self.acceptance_rate:.3f}, outputs "
                f"{'identical' if self.outputs_equal else 'DIFFER'}"]


def run_dspark_bench(args: ModelArgs, *, schedule: str = "all", batch: int = 1, prompt_len: int = 16,
                     new_tokens: int = 24, repeats: int = 3, seed: int = 0, device: str = "cpu",
                     dtype: torch.dtype = torch.float32, options=None) -> DSparkBenchResult:
    """Random-init model and prompts; plain and speculative greedy generation alternate, repeats times."""
    if not args.has_dspark:
        raise InputError(f"bench --dspark: config '{args.name}' has no DSpark drafter")
    model = bench_model(args, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                        seed=seed, device=device, dtype=dtype, options=options)
    engine = Engine(model, source=f"random init (seed {seed})")
    cfg = DSparkConfig.from_settings(schedule, model=model)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, args.vocab_size, (batch, prompt_len), generator=g).tolist()
    plain = GenerationRequest.of(new_tokens, seed=seed, stop_tokens=())
    requests = {False: plain, True: replace(plain, dspark=cfg)}
    engine.generate(prompts, replace(plain, max_new_tokens=2))  # warm-up
    off, on, ratios, results, equal = [], [], [], [], True
    for rep in range(repeats):
        order = (False, True) if rep % 2 == 0 else (True, False)  # a busy machine slows both alike
        runs = {}
        for spec in order:
            runs[spec] = engine.generate(prompts, requests[spec])
        equal &= runs[True].tokens == runs[False].tokens
        off.append(runs[False].decode_tokens_per_s)
        on.append(runs[True].decode_tokens_per_s)
        ratios.append(on[-1] / off[-1])
        results.append(runs[True].metrics)
    m = results[-1]  # greedy: every repeat commits the same tokens
    return DSparkBenchResult(
        config=args.name or "model", schedule=schedule, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        repeats=repeats, threads=torch.get_num_threads(), plain_tokens_per_s=statistics.median(off),
        dspark_tokens_per_s=statistics.median(on), speedup=statistics.median(ratios),
        tokens_per_target_forward=m.tokens_per_forward, mean_accepted_length=m.mean_accepted_length,
        acceptance_rate=m.acceptance_rate, outputs_equal=equal)
