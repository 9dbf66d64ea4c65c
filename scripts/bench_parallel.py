"""Decode tokens/s on 1, 2 and 4 CPU ranks (torchrun, gloo); communication per decode token of V4.1-Flash at TP/EP 8.

    .venv/bin/python scripts/bench_parallel.py [--config default-small] [--ranks 1 2 4] [--runs 3] [--results OUT]

Each run is one `engine bench --json` (1 rank: a plain process; N ranks: torchrun --standalone), one torch thread
per rank; the runs of the rank counts are interleaved so that a busy machine slows them alike. Reported: the
median and the range over runs of the bench's median decode step, and the ratio to 1 rank.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.parallel.volume import volume_lines  # noqa: E402
from engine.spec.presets import resolve_config  # noqa: E402


def bench_once(config: Path, ranks: int, a: argparse.Namespace) -> dict:
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", str(ranks)]
    cmd = [*launch, "-m", "engine", "bench", "--config", str(config), "--json", "--threads", "1",
           "--prompt-len", str(a.prompt_len), "--new-tokens", str(a.new_tokens), "--repeats", str(a.repeats)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False, timeout=1800)
    if run.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="default-small", help="preset or config.json (default default-small)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--runs", type=int, default=3, help="launches per rank count (default 3)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="bench repeats inside each launch (default 2)")
    p.add_argument("--results", help="also write the table as a results file (docs/results/parallel.json)")
    a = p.parse_args(argv)
    from engine.bench.results_file import ResultsRecorder, spread
    recorder = ResultsRecorder(a.results, "parallel", "scripts/bench_parallel.py", argv)
    args = resolve_config(a.config)
    widest = max(a.ranks)
    note = ""
    if args.o_groups % widest:  # random-init weights: any grouping is a valid model of the same size
        note = f" (o_groups {args.o_groups} → {widest}, so that {widest} ranks divide it)"
        args = args.replace(o_groups=widest)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps({k: v for k, v in args.to_dict().items() if k != "name"}))
        rates: dict[int, list[float]] = {n: [] for n in a.ranks}
        for _ in range(a.runs):
            for n in a.ranks:
                rates[n].append(bench_once(config, n, a)["decode_tokens_per_s"])
    one = statistics.median(rates[a.ranks[0]])
    print(f"{a.config}{note}: decode tokens/s, batch 1, prompt {a.prompt_len}, {a.new_tokens} new tokens, "
          f"{a.runs} launches each, 1 torch thread per rank, {os.cpu_count()} CPU cores")
    for n in a.ranks:
        med = statistics.median(rates[n])
        print(f"  {n} rank{'s' if n > 1 else ' '}  median {med:8.1f}   "
              f"range {min(rates[n]):8.1f} – {max(rates[n]):8.1f}"
              f"   × {med / one:.2f} of {a.ranks[0]} rank")
    print()
    volume = volume_lines(resolve_config("deepseek-v4.1-flash"), 8)
    print("\n".join(volume))
    recorder.write([{"ranks": n, "decode_tokens_per_s": spread(rates[n]),
                     "ratio": statistics.median(rates[n]) / one} for n in a.ranks], 1,
                   settings={"config": a.config, "note": note.strip(), "prompt_len": a.prompt_len,
                             "new_tokens": a.new_tokens, "runs": a.runs, "repeats": a.repeats},
                   notes=volume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
