"""bf16 matrix products on this CPU, four ways: fp32 operands, torch's bf16 kernel, both widened to fp32 for the call,
and the input widened against a resident fp32 copy of the weight (engine.speedups.cpu_bf16's choices).

    .venv/bin/python scripts/bench_cpu_bf16.py [--threads 1] [--rows 1,6,64] [--sizes 192x192,...] [--rounds 7]
        [--results OUT]

Each round times every way once per shape and row count, interleaved (so a change of machine speed reaches all
four alike); the table shows microseconds per product as the median [min–max] over the rounds, and each bf16 way's
median relative to fp32; the last column names the way the engine takes for that product (Linear's choice in
engine.speedups.cpu_bf16.linear). The default shapes are the shipped model's (its [96, 192] and [192, 192]
projections, the [384, 192] expert stack of W1 and W3, the [3229, 192] head) and square weights from 512² to 4096²,
at and beyond engine.speedups.cpu_bf16.RESIDENT_MAX_ELEMENTS.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = "96x192,192x192,384x192,3229x192,512x512,1024x1024,2048x2048,4096x4096"
WAYS = ("fp32", "bf16 kernel", "widened per call", "resident fp32 copy")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,6,64", help="comma-separated rows per product")
    p.add_argument("--sizes", default=SIZES, help="comma-separated weight shapes OUTxIN")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.05, help="time per way, shape and round")
    p.add_argument("--results", help="also write the table as a results file (docs/results/cpu_bf16.json)")
    args = p.parse_args(argv)
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
        args.sizes = [tuple(int(n) for n in s.split("x")) for s in args.sizes.split(",")]
    except ValueError:
        p.error("--rows takes integers (1,6,64) and --sizes shapes OUTxIN (192x192,1024x1024)")
    if args.threads < 1 or args.rounds < 1 or args.seconds <= 0 or min(args.rows) < 1 or \
            any(len(s) != 2 or min(s) < 1 for s in args.sizes):
        p.error("--threads, --rounds, --rows and the sizes must be positive")
    return args


def per_call_us(f, seconds: float) -> float:
    """Microseconds per call of f, over as many calls as fit in `seconds` (after one warm-up call)."""
    f()
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        f()
        n += 1
    return 1e6 * elapsed / n


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    from engine.bench.machine import machine_description
    from engine.bench.results_file import ResultsRecorder, spread
    from engine.speedups.cpu_bf16 import (
        COPY_MAX_MACS,
        RESIDENT_MAX_ELEMENTS,
        native_bf16_matmul,
        through_fp32_copy,
        widens,
    )
    recorder = ResultsRecorder(args.results, "cpu_bf16", "scripts/bench_cpu_bf16.py", argv)
    torch.set_num_threads(args.threads)
    cases = []
    for out, inp in args.sizes:
        w32 = torch.randn(out, inp)
        wb = w32.bfloat16()
        resident = wb.float()
        for rows in args.rows:
            xb = torch.randn(rows, inp).bfloat16()
            x32 = xb.float()
            engine_way = ("resident fp32 copy" if through_fp32_copy(rows, wb)
                          else "widened per call" if widens(xb, wb) else "bf16 kernel")
            cases.append(((out, inp), rows, engine_way, {
                "fp32": lambda x32=x32, w32=w32: F.linear(x32, w32),
                "bf16 kernel": lambda xb=xb, wb=wb: F.linear(xb, wb),
                "widened per call": lambda xb=xb, wb=wb: F.linear(xb.float(), wb.float()).bfloat16(),
                "resident fp32 copy": lambda xb=xb, r=resident: F.linear(xb.float(), r).bfloat16()}))
    times = {(shape, rows, way): [] for shape, rows, _, _ in cases for way in WAYS}
    for r in range(args.rounds):
        for shape, rows, _, ways in cases:
            order = WAYS[r % 4:] + WAYS[:r % 4]
            for way in order:
                times[shape, rows, way].append(per_call_us(ways[way], args.seconds))
        print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr)
    print(file=sys.stderr)
    native = native_bf16_matmul()
    print(f"bf16 products F.linear(x [rows, in], w [out, in]); {machine_description('cpu')}, "
          f"torch {torch.__version__}, {args.threads} thread(s); "
          f"bf16 matrix instructions: {'yes' if native else 'no'}; "
          f"resident copies up to {RESIDENT_MAX_ELEMENTS:,} elements, read by products up to {COPY_MAX_MACS:,} "
          f"multiply-adds{'' if native else ' (every product: no bf16 instructions)'}; µs per product, "
          f"median [min–max] of {args.rounds} interleaved rounds (× fp32's median)")
    print(f"{'weight':>10} {'rows':>5}  " + "  ".join(f"{w:>28}" for w in WAYS) + "  engine")
    table = []
    for shape, rows, engine_way, _ in cases:
        base = statistics.median(times[shape, rows, "fp32"])
        table.append({"weight": f"{shape[0]}x{shape[1]}", "rows": rows, "engine": engine_way,
                      "ways": {way: {**spread(times[shape, rows, way]),
                                     "ratio": statistics.median(times[shape, rows, way]) / base} for way in WAYS}})
        cells = []
        for way in WAYS:
            ts = times[shape, rows, way]
            med = statistics.median(ts)
            cells.append(f"{med:8.1f} [{min(ts):7.1f}–{max(ts):7.1f}] ×{med / base:4.2f}")
        print(f"{shape[0]:>5}x{shape[1]:<4} {rows:>5}  " + "  ".join(f"{c:>28}" for c in cells) + f"  {engine_way}")
    recorder.write(table, args.threads, settings={"rounds": args.rounds, "seconds": args.seconds,
                                                  "bf16_instructions": native, "resident_max_elements":
                                                  RESIDENT_MAX_ELEMENTS, "copy_max_macs": COPY_MAX_MACS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
