"""Long prompts on tiny-v4.1: prefill time and peak memory by prompt length, the indexer's S·S/r part apart.

    .venv/bin/python scripts/bench_long_prompt.py [--lengths 512,2048,8192,32768] [--runs 3] [--dtype float32]
        [--prefill-chunk 4096] [--results docs/results/long_prompt.json]

Each length runs in a fresh process (its peak RSS is its own): tiny-v4.1 with max_seq_len = the length, random-init
weights, one random prompt prefilled in consecutive chunks of --prefill-chunk through one cache (as generation does),
--runs times; one torch thread. The indexer's share is the time inside its forwards (the part the architecture makes
quadratic: each query scores the S/ratio compressed rows before it); "rest" is the prefill less that (rendered with
its growth over the previous length's, scaled by length: ×1.00 is linear). Peak RSS above the process's
RSS after building the model (its weights and warm-up) is shown beside the plan's whole figure for that context
(engine.plan.host_run_bytes: weights, caches, working terms, staging), a ceiling it must stay under."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its RSS now (Linux: clear_refs 5) and return that RSS."""
    from engine.plan.memory_fit import process_memory
    Path("/proc/self/clear_refs").write_text("5")
    return process_memory("VmRSS")


def one_length(length: int, runs: int, dtype_name: str, chunk: int) -> dict:
    """In this process: build, prefill `runs` times, time the indexer; → the row."""
    import torch

    from engine.bench.cpu import bench_model
    from engine.model.indexer import Indexer
    from engine.spec.presets import resolve_config
    torch.set_num_threads(1)
    args = resolve_config("tiny-v4.1").replace(max_seq_len=length)
    model = bench_model(args, batch=1, prompt_len=length - 2, new_tokens=2, repeats=1, seed=0, device="cpu",
                        dtype=getattr(torch, dtype_name))
    indexer_s = [0.0]

    def timed(module, inputs, output):      # forward hooks: the indexer's inclusive time
        indexer_s[0] += time.perf_counter() - module._t0

    for m in model.modules():
        if isinstance(m, Indexer):
            m.register_forward_pre_hook(lambda module, inputs: setattr(module, "_t0", time.perf_counter()))
            m.register_forward_hook(timed)
    tokens = torch.randint(3, args.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(tokens[:, :16], model.new_cache(1, 16))                      # warm-up: kernels loaded
        base = reset_peak()
        totals, indexers = [], []
        for _ in range(runs):
            cache, indexer_s[0] = model.new_cache(1, length), 0.0
            t0 = time.perf_counter()
            for start in range(0, length, chunk):
                model(tokens[:, start:start + chunk], cache, logits="last")
            totals.append(time.perf_counter() - t0)
            indexers.append(indexer_s[0])
            del cache
    from engine.plan.memory_fit import process_memory
    peak = process_memory("VmHWM")
    from engine.plan.host_run import host_run_bytes
    plan = host_run_bytes(args, length, value_bytes=torch.finfo(getattr(torch, dtype_name)).bits // 8,
                          prefill_chunk=chunk)
    return {"tokens": length, "prefill_s": statistics.median(totals), "prefill_s_min": min(totals),
            "prefill_s_max": max(totals), "indexer_s": statistics.median(indexers),
            "rest_s": statistics.median(t - i for t, i in zip(totals, indexers)),
            "peak_above_start_bytes": max(peak - base, 0), "plan_bytes": plan["total"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,2048,8192,32768")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--prefill-chunk", type=int, default=4096)
    p.add_argument("--results", type=Path, metavar="OUT", help="also write a results file (docs/results/...)")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)             # the child process: one length
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one_length(a.one, a.runs, a.dtype, a.prefill_chunk)))
        return 0
    from engine.bench.results_file import ResultsRecorder
    recorder = ResultsRecorder(a.results, "long_prompt", "scripts/bench_long_prompt.py", argv)
    rows = []
    for length in [int(x) for x in a.lengths.split(",")]:
        run = subprocess.run([sys.executable, __file__, "--one", str(length), "--runs", str(a.runs), "--dtype",
                              a.dtype, "--prefill-chunk", str(a.prefill_chunk)], capture_output=True, text=True,
                             check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        row = json.loads(run.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['tokens']:>6} tokens: prefill {row['prefill_s']:.2f} s (indexer {row['indexer_s']:.2f} s, "
              f"rest {row['rest_s']:.2f} s), peak +"
              f"{row['peak_above_start_bytes'] / 2**20:,.0f} MiB, plan {row['plan_bytes'] / 2**20:,.0f} MiB",
              flush=True)
    recorder.write(rows, 1, settings={"config": "tiny-v4.1", "dtype": a.dtype, "runs": a.runs,
                                      "prefill_chunk": a.prefill_chunk})
    return 0


if __name__ == "__main__":
    sys.exit(main())
