"""The routes a user runs an official-format (FP8 / MXFP4) checkpoint on, each timed and measured in one launch:

    python scripts/gpu_routes.py --checkpoint DIR --route plain --results OUT/plain.json
    torchrun --standalone --nproc-per-node N scripts/gpu_routes.py --checkpoint DIR --route torchrun --results ...
    python scripts/gpu_routes.py --checkpoint DIR --route host-experts --results OUT/host.json

plain: the whole model on one device; torchrun: heads, groups, experts and vocabulary split over the launched
ranks (engine.parallel); host-experts: the routed experts in host memory, computed there, the rest on the device.
Each launch loads the checkpoint (seconds), generates greedily once to warm up, then `--repeats` times, and writes
one results file (engine/bench/results_file.py) from rank 0: load seconds, prefill and decode tokens/s (median
and range), the greedy text's sha256 (equal texts across routes: the same model), and each GPU's peak memory
(torch.cuda.max_memory_allocated, gathered from every rank) and the process's peak host memory (VmHWM).
scripts/gpu_check.sh runs the three routes on a lent GPU machine; on a CPU it runs as well (no GPU columns).
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="an official-format folder (e.g. from `engine quantize`)")
    p.add_argument("--route", choices=("plain", "torchrun", "host-experts"), required=True)
    p.add_argument("--device", default=None, help="cuda when there is one, else cpu (default)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="float32",
                   help="float32 (default): every route must give the same greedy text; in bfloat16 a split run "
                        "rounds elsewhere and may not")
    p.add_argument("--prompt", default="Now is the winter of our discontent")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", help="write the row as a results file")
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    from engine.bench.results_file import ResultsRecorder, spread
    from engine.generation.engine import Engine
    from engine.parallel import is_main_process, leave_world
    from engine.plan.memory_fit import process_memory
    from engine.request import GenerationRequest

    recorder = ResultsRecorder(a.results, "gpu_routes", "scripts/gpu_routes.py", argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, a.dtype)
    start = time.perf_counter()
    placement = {"experts": "host"} if a.route == "host-experts" else {}
    engine = Engine.load(checkpoint=a.checkpoint, device=device, dtype=dtype, **placement)
    load_s = time.perf_counter() - start
    ids = engine.encode_prompt(a.prompt)
    request = GenerationRequest.greedy(a.new_tokens)
    engine.generate([ids], request)                                     # warm-up: first launches, allocator
    if device == "cuda":
        torch.cuda.synchronize()
    prefill, decode, texts = [], [], set()
    for _ in range(a.repeats):
        result = engine.generate([ids], request)
        prefill.append(len(ids) / result.prefill_s)
        decode.append(len(result.step_times) / result.decode_s)
        texts.add(hashlib.sha256(engine.tokenizer.decode(result.tokens[0]).encode()).hexdigest())
    peaks = [process_memory("VmHWM") or 0, torch.cuda.max_memory_allocated() if device == "cuda" else 0]
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    if ranks > 1:  # every rank's peaks, in rank order (a tensor all-gather: nothing pickled)
        mine = torch.tensor(peaks, dtype=torch.float64, device=device)
        every = [torch.empty_like(mine) for _ in range(ranks)]
        dist.all_gather(every, mine)
        peaks_by_rank = [[int(v) for v in t.tolist()] for t in every]
    else:
        peaks_by_rank = [peaks]
    row = {"route": a.route, "ranks": ranks, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "dtype": a.dtype, "load_s": round(load_s, 2), "prefill_tokens_per_s": spread(prefill),
           "decode_tokens_per_s": spread(decode), "distinct_texts": len(texts), "text_sha256": sorted(texts)[0],
           "gpu_peak_bytes": [r[1] for r in peaks_by_rank], "host_peak_bytes": [r[0] for r in peaks_by_rank]}
    if is_main_process():
        print(f"{a.route}: {ranks} rank(s) on {row['device']}, load {load_s:.1f} s, prefill "
              f"{statistics.median(prefill):.1f} tok/s, decode {statistics.median(decode):.1f} tok/s, GPU peak "
              f"{max(row['gpu_peak_bytes']) / 2**30:.2f} GiB, host peak {max(row['host_peak_bytes']) / 2**30:.2f} GiB, "
              f"text {row['text_sha256'][:12]}")
        recorder.write([row], torch.get_num_threads(),
                       settings={"checkpoint": Path(a.checkpoint).name, "prompt_tokens": len(ids),
                                 "new_tokens": a.new_tokens, "repeats": a.repeats})
    leave_world()
    return 0


if __name__ == "__main__":
    sys.exit(main())
