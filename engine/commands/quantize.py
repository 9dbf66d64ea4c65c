"""`python -m engine quantize --checkpoint DIR --out DIR [--shards N]`: write a checkpoint in the official format;
`--synthetic CONFIG` instead writes seeded random weights of a config in that format (engine.checkpoint.synthetic)."""
from __future__ import annotations

import argparse
import sys
import time

HELP = ("convert a checkpoint of this project into the official V4.1 layout (FP8 weights with E8M0 [32, 32] block "
        "scales, MXFP4 routed experts, FP8 Engram rows, sharded with model.safetensors.index.json), or write "
        "seeded random weights of a config in that layout (--synthetic)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint",
                        help="the source: a folder with model.safetensors (or an index) and config.json")
    source.add_argument("--synthetic", metavar="CONFIG",
                        help="no source: seeded random weights of this config (a path or a name in configs/), "
                             "drawn and quantized tensor by tensor, a block of rows at a time")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty)")
    parser.add_argument("--shards", type=int, default=None,
                        help="number of shard files (default: one per ~5 GiB); each weight stays with its scale")
    parser.add_argument("--seed", type=int, default=0, help="with --synthetic: the random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    t0 = time.perf_counter()
    if args.synthetic is not None:
        from ..checkpoint.synthetic import write_synthetic
        from ..spec.presets import resolve_config
        from .arg_checks import check_seed
        written = write_synthetic(resolve_config(args.synthetic), args.out, seed=check_seed(args.seed),
                                  shards=args.shards)
        source = f"synthetic, seed {args.seed}"
    else:
        from ..checkpoint.official_writer import write_official
        written = write_official(args.checkpoint, args.out, args.shards)
        source = f"source {written.source_bytes / 2**20:,.1f} MiB"
    print(f"wrote {written.n_tensors:,} tensors, {written.total_bytes / 2**20:,.1f} MiB in {len(written.shards)} "
          f"shard(s) to {written.folder} ({source}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
