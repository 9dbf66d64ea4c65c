"""The aten ops of a decode step, counted per dtype: how many ops one step of the engine's eager decode runs and
where the self CPU time goes (torch.profiler), for each dtype side by side.

    .venv/bin/python scripts/decode_ops.py [--config tiny-v4.1] [--dtypes float32,bfloat16] [--steps 20] [--top 15]
        [--results OUT]

A seeded random-init model of the config (as `engine bench` builds it: prepare_for_inference, batch 1, one thread),
a prompt of 32 tokens, 5 greedy decode steps to warm up, then --steps profiled ones. The table lists per step the
op kinds whose self time differs most between the first dtype and the others (all of them with one dtype), with
their calls and self microseconds; the totals line counts every op. Profiling slows each op, so the times show
where a step goes, not its speed: `engine bench` measures that.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DTYPES = ("float32", "bfloat16", "float64")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tiny-v4.1", help="config.json path or preset name")
    p.add_argument("--dtypes", default="float32,bfloat16", help=f"comma-separated, of {', '.join(DTYPES)}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--results", help="also write the table as a results file (docs/results/decode_ops.json)")
    args = p.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    if any(d not in DTYPES for d in args.dtypes) or len(set(args.dtypes)) != len(args.dtypes):
        p.error(f"--dtypes takes distinct names of {', '.join(DTYPES)}")
    if args.steps < 1 or args.top < 1:
        p.error("--steps and --top must be positive")
    return args


def profile_steps(model, vocab_size: int, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """(calls, self µs) per aten op kind over `steps` greedy decode steps after a prompt of 32 and 5 warm-up steps."""
    import torch
    calls, self_us = collections.Counter(), collections.Counter()
    with torch.inference_mode():
        cache = model.new_cache(1, 32 + 5 + steps)
        prompt = torch.randint(3, vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
        logits = model(prompt, cache, logits="last").logits                  # [1, V]
        for _ in range(5):
            logits = model(logits.argmax(-1, keepdim=True), cache, logits="last").logits
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                logits = model(logits.argmax(-1, keepdim=True), cache, logits="last").logits
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            calls[event.key] += event.count
            self_us[event.key] += event.self_cpu_time_total
    return calls, self_us


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from engine.bench.cpu import bench_model
    from engine.bench.machine import machine_description
    from engine.bench.results_file import ResultsRecorder
    from engine.spec.errors import InputError
    from engine.spec.presets import resolve_config
    recorder = ResultsRecorder(args.results, "decode_ops", "scripts/decode_ops.py", argv)
    torch.set_num_threads(1)
    profiles = {}
    try:
        config = resolve_config(args.config)
        for name in args.dtypes:
            model = bench_model(config, batch=1, prompt_len=32, new_tokens=5 + args.steps, repeats=1, seed=0,
                                device="cpu", dtype=getattr(torch, name))
            profiles[name] = profile_steps(model, config.vocab_size, args.steps)
    except InputError as e:   # an unknown preset, a broken config, more steps than the model's max_seq_len
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = args.steps
    print(f"{config.name or args.config}: aten ops per eager decode step (batch 1, 1 thread, {n} profiled steps); "
          f"{machine_description('cpu')}, torch {torch.__version__}")
    first = args.dtypes[0]
    kinds = set().union(*(calls for calls, _ in profiles.values()))
    spread = {k: max(abs(profiles[d][1][k] - profiles[first][1][k]) for d in args.dtypes) or profiles[first][1][k]
              for k in kinds}
    header = "".join(f"  {d + ' calls':>15} {d + ' µs':>13}" for d in args.dtypes)
    print(f"{'op':36}{header}")
    rows = []
    for k in sorted(kinds, key=lambda k: -spread[k])[:args.top]:
        rows.append({"op": k, **{d: {"calls": profiles[d][0][k] / n, "self_us": profiles[d][1][k] / n}
                                 for d in args.dtypes}})
        print(f"{k[:36]:36}" + "".join(f"  {profiles[d][0][k] / n:15.0f} {profiles[d][1][k] / n:13.0f}"
                                       for d in args.dtypes))
    print(f"{'all aten ops':36}" + "".join(f"  {sum(profiles[d][0].values()) / n:15.0f} "
                                           f"{sum(profiles[d][1].values()) / n:13.0f}" for d in args.dtypes))
    rows.append({"op": "all aten ops", **{d: {"calls": sum(profiles[d][0].values()) / n,
                                              "self_us": sum(profiles[d][1].values()) / n} for d in args.dtypes}})
    recorder.write(rows, 1, settings={"config": config.name or args.config, "dtypes": args.dtypes, "steps": n})
    return 0


if __name__ == "__main__":
    sys.exit(main())
