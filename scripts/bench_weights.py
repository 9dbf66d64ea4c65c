"""Bytes read and time of each Learned weights view (engine.weights), on whole folders and on the same folders with
half their shards deleted (a partial download).

    .venv/bin/python scripts/bench_weights.py [--threads 1] [--work DIR] [--results docs/results/weights.json]

Folders, in the official layout: the shipped model (checkpoints/default, 8 shards, `engine quantize`'s writer) and
a wider synthetic one (the same architecture with 96 routed experts of width 1024, seeded random weights by
`engine quantize --synthetic`). Each view runs once on a fresh reader; the expert norms run twice (computed, then
from their cache file). Bytes are the stored bytes of every tensor or slice read (WeightReader.bytes_read)."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", help="folder for the checkpoints (default: a temporary one, removed after)")
    p.add_argument("--results", help="also write the table as a results file (docs/results/weights.json)")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error("--threads must be at least 1")
    return args


def folders(work: Path) -> list[tuple[str, Path]]:
    from engine.checkpoint.official_layout import official_args
    from engine.checkpoint.official_writer import write_official
    from engine.checkpoint.synthetic import write_synthetic
    from engine.spec.config import load_config
    shipped = write_official(ROOT / "checkpoints" / "default", work / "shipped", shards=SHARDS).folder
    wide_args = official_args(load_config(ROOT / "checkpoints" / "default" / "config.json")).replace(
        name="default-wide", n_routed_experts=96, moe_inter_dim=1024)
    wide = write_synthetic(wide_args, work / "wide", shards=SHARDS).folder
    out = []
    for label, folder in (("shipped model", shipped), ("wide synthetic", wide)):
        half = work / f"{folder.name}-half"
        shutil.copytree(folder, half)
        for shard in sorted(half.glob("model-*.safetensors"))[1::2]:
            shard.unlink()
        out += [(label, folder), (f"{label}, half the shards", half)]
    return out


def measure(label: str, folder: Path) -> list[dict]:
    from engine.weights.expert_norms import cache_path, expert_norms
    from engine.weights.reader import WeightReader
    from engine.weights.views import EXPERTS, VIEWS, run_view
    cache_path(folder).unlink(missing_ok=True)
    rows = []
    for name in [*VIEWS, EXPERTS, EXPERTS]:
        reader = WeightReader(folder)
        result = expert_norms(reader) if name == EXPERTS else run_view(reader, name)
        shards = len(set(reader.weight_map.values()))
        rows.append({"folder": label, "shards": shards, "shards_here": shards - len(reader.missing_shards),
                     "view": name + (" (cached)" if result.cached else ""), "bytes_read": result.bytes_read,
                     "reads": result.tensors_read, "total_bytes": reader.total_bytes,
                     "folder_bytes": reader.folder_bytes, "seconds": round(result.seconds, 4),
                     "statistics": len(result.rows), "absent_boxes": len(result.absent),
                     "problems": len(result.problems)})
        print(f"{label:<34} {rows[-1]['view']:<16} {result.bytes_read:>12,} B {result.seconds:8.3f} s "
              f"{len(result.rows):>6} stats {len(result.absent):>4} absent", file=sys.stderr)
    cache_path(folder).unlink(missing_ok=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from engine.bench.results_file import ResultsRecorder
    recorder = ResultsRecorder(args.results, "weights", "scripts/bench_weights.py", argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-weights-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = [row for label, folder in folders(work) for row in measure(label, folder)]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    recorder.write(rows, args.threads, settings={"shards": SHARDS},
                   notes=["each view on a fresh reader, once, right after the folder was written (its pages in the "
                          "page cache); the expert norms twice, the second time from their cache file"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
