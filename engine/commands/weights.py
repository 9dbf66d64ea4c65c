"""`python -m engine weights FOLDER [--view V ...] [--experts] [--compare OTHER] [--export FILE]`: the learned
parameters of a checkpoint folder (the release, a subset of its shards, or this project's own) as statistics per
diagram box, reading only the tensors the chosen views show, and saying how many bytes that was."""
from __future__ import annotations

import argparse
import statistics
import sys

HELP = ("statistics of a checkpoint folder's learned parameters per diagram box (router bias, mHC mixing, sinks, "
        "norms, Engram, DSpark; --experts for expert norms), read lazily; --compare, --export")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..weights.views import EXPERTS, VIEWS
    parser.add_argument("folder", help="a checkpoint folder: config.json and model.safetensors(.index.json); shards "
                                       "the index names may be missing")
    parser.add_argument("--view", action="append", choices=[*VIEWS, EXPERTS],
                        help="a view to compute (repeatable; default: every view but the experts)")
    parser.add_argument("--experts", action="store_true",
                        help="also the routed experts' weight norms (most of the checkpoint's bytes; cached per "
                             "shard beside the folder)")
    parser.add_argument("--compare", metavar="OTHER", help="a second checkpoint folder: the same statistics side by "
                                                           "side, with their differences")
    parser.add_argument("--export", metavar="FILE", help="write the statistics (or the comparison) as .parquet or "
                                                         ".csv")


def run(args: argparse.Namespace) -> int:
    from ..weights.compare import compare_rows, summary
    from ..weights.export import write_table
    from ..weights.reader import WeightReader
    from ..weights.views import EXPERTS, run_views
    names = [v for v in (args.view or []) if v != EXPERTS] if args.view else None
    experts = args.experts or EXPERTS in (args.view or [])
    results = []
    for folder in [args.folder, *([args.compare] if args.compare else [])]:
        reader = WeightReader(folder)
        print(_header(reader))
        views = run_views(reader, names, experts, progress=_progress)
        for result in views.values():
            print("\n".join(_describe(result)))
        print(f"read {reader.bytes_read:,} B of {reader.total_bytes:,} B "
              f"({100 * reader.bytes_read / max(1, reader.total_bytes):.3f} %) in {reader.reads:,} reads\n")
        results.append([row for r in views.values() for row in r.rows])
    rows = results[0]
    if args.compare:
        rows = compare_rows(results[0], results[1])
        print(f"comparison: a = {args.folder}, b = {args.compare}")
        for s in summary(rows):
            print(f"  {s['view']:<15} {s['stat']:<24} {s['differ']:>6} of {s['both']:>6} differ, largest "
                  f"|b − a| {s['max_abs_difference']:.4g}" + (f" at {s['at']}" if s["at"] else "")
                  + (f"; only in a: {s['only_a']}" if s["only_a"] else "")
                  + (f"; only in b: {s['only_b']}" if s["only_b"] else ""))
    if args.export:
        print(f"wrote {len(rows):,} rows to {write_table(rows, args.export)}")
    return 0


def _header(reader) -> str:
    shards = len(set(reader.weight_map.values()))
    lines = [f"{reader.folder}: {reader.args.name or reader.args.family} ({reader.args.family}), {shards} shard(s), "
             f"{len(reader.entries):,} tensors readable, {reader.folder_bytes:,} of {reader.total_bytes:,} B here"]
    if reader.missing_shards:
        lines.append(f"  missing shards ({len(reader.missing_shards)}): {', '.join(reader.missing_shards[:6])}"
                     + (" ..." if len(reader.missing_shards) > 6 else ""))
    lines += [f"  unreadable shard: {why}" for why in reader.broken_shards.values()]
    return "\n".join(lines)


def _describe(r) -> list[str]:
    out = [f"[{r.view}] {len(r.rows):,} statistics, read {r.bytes_read:,} B in {r.tensors_read:,} reads, "
           f"{r.seconds:.2f} s" + (" (cached)" if r.cached else "")]
    by_stat: dict[str, list[float]] = {}
    for row in r.rows:
        by_stat.setdefault(row["stat"], []).append(row["value"])
    for stat, values in by_stat.items():
        out.append(f"  {stat:<24} n={len(values):<6} min {min(values):.4g}  median {statistics.median(values):.4g}  "
                   f"max {max(values):.4g}")
    if r.absent:
        first = next(iter(r.absent.items()))
        out.append(f"  absent: {len(r.absent)} box(es), e.g. {first[0]}: {first[1]}")
    out += [f"  problem: {why}" for why in list(r.problems.values())[:5]]
    out += [f"  note: {n}" for n in r.notes]
    return out


def _progress(done: int, total: int, shard: str) -> None:
    print(f"  experts: {done}/{total} shards ({shard})", file=sys.stderr)
