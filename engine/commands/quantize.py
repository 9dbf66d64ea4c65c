"""`python -m engine quantize --checkpoint DIR --out DIR [--shards N]`: write a checkpoint in the official format."""
from __future__ import annotations

import argparse
import sys
import time

HELP = ("convert a checkpoint of this project into the official V4.1 layout: FP8 weights with E8M0 [32, 32] block "
        "scales, MXFP4 routed experts, FP8 Engram rows, sharded with model.safetensors.index.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True,
                        help="the source: a folder with model.safetensors (or an index) and config.json")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty)")
    parser.add_argument("--shards", type=int, default=None,
                        help="number of shard files (default: one per ~5 GiB); each weight stays with its scale")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..checkpoint.official_writer import write_official
    t0 = time.perf_counter()
    written = write_official(args.checkpoint, args.out, args.shards)
    print(f"wrote {written.n_tensors:,} tensors, {written.total_bytes / 2**20:,.1f} MiB in {len(written.shards)} "
          f"shard(s) to {written.folder} (source {written.source_bytes / 2**20:,.1f} MiB) in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
