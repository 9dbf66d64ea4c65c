"""One sampled token on this CPU, two ways: torch.multinomial(p, 1) and engine.model.sampling.sample_index (the
engine's draw: one uniform number against the running sum).

    .venv/bin/python scripts/bench_sampling.py [--threads 1] [--vocab 3229,129280] [--rounds 7] [--results OUT]

Each round times both ways once per vocabulary size, interleaved; the table shows microseconds per draw as the median
[min–max] over the rounds, and sample_index's median relative to torch.multinomial's. The distribution is a softmax
of random logits (a draw's cost does not depend on its values); the default sizes are the shipped model's vocabulary
and DeepSeek-V4's 129,280 ids.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", default="3229,129280", help="comma-separated vocabulary sizes")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.1, help="time per way, size and round")
    p.add_argument("--results", help="also write the table as a results file (docs/results/sampling.json)")
    args = p.parse_args(argv)
    try:
        args.vocab = [int(v) for v in args.vocab.split(",")]
    except ValueError:
        p.error("--vocab takes integers (3229,129280)")
    if args.threads < 1 or args.rounds < 1 or args.seconds <= 0 or min(args.vocab) < 1:
        p.error("--threads, --rounds and every --vocab size must be at least 1, --seconds above 0")
    return args


def per_call(fn, seconds: float) -> float:
    """Microseconds per call of fn, calling it for about `seconds`."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return 1e6 * (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from engine.bench.machine import machine_description
    from engine.bench.results_file import ResultsRecorder, spread
    from engine.model.sampling import sample_index

    recorder = ResultsRecorder(args.results, "sampling", "scripts/bench_sampling.py", argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    probs = {v: torch.softmax(torch.randn(v, generator=g), -1) for v in args.vocab}
    ways = {"torch.multinomial": lambda p: torch.multinomial(p, 1, generator=g),
            "sample_index": lambda p: sample_index(p, g)}
    times = {(v, w): [] for v in args.vocab for w in ways}
    for r in range(args.rounds):
        print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        for v in args.vocab:
            for w, fn in (ways.items() if r % 2 == 0 else reversed(ways.items())):
                times[v, w].append(per_call(lambda: fn(probs[v]), args.seconds))
    print(file=sys.stderr)
    print(f"one draw from a {'/'.join(map(str, args.vocab))}-id distribution; {machine_description('cpu')}, "
          f"{args.threads} thread(s); µs per draw, median [min–max] of {args.rounds} interleaved rounds")
    print(f"{'vocabulary':>10} {'torch.multinomial':>26} {'sample_index':>26}  ratio")
    rows = []
    for v in args.vocab:
        cells = []
        for w in ways:
            t = times[v, w]
            cells.append(f"{statistics.median(t):8.1f} [{min(t):7.1f}–{max(t):7.1f}]")
        ratio = statistics.median(times[v, "sample_index"]) / statistics.median(times[v, "torch.multinomial"])
        print(f"{v:>10} {cells[0]:>26} {cells[1]:>26}  ×{ratio:.3f}")
        rows.append({"vocabulary": v, "multinomial_us": spread(times[v, "torch.multinomial"]),
                     "sample_index_us": spread(times[v, "sample_index"]), "ratio": ratio})
    recorder.write(rows, args.threads, settings={"rounds": args.rounds, "seconds": args.seconds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
