"""`python -m engine card`: measure a checkpoint on its prepared corpus and write MODEL_CARD.md beside it."""
from __future__ import annotations

import argparse

from .run_args import apply_threads

HELP = "measure a trained checkpoint (held-out loss vs unigram, expert balance, Engram gates, DSpark, samples) " \
       "and write MODEL_CARD.md, card.json and loss_curve.png into it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..training.card import CardOptions
    d = CardOptions()
    parser.add_argument("checkpoint", help="checkpoint directory (model.safetensors, config.json, log.csv, id_map.json)")
    parser.add_argument("--data", default="data/shakespeare", help="directory written by prepare_data")
    parser.add_argument("--seq", type=int, default=d.seq, help=f"tokens per held-out window (default {d.seq})")
    parser.add_argument("--windows", type=int, default=d.windows, help=f"held-out windows (default {d.windows})")
    parser.add_argument("--batch", type=int, default=d.batch, help=f"windows per forward (default {d.batch})")
    parser.add_argument("--new-tokens", type=int, default=d.new_tokens,
                        help=f"new tokens per prompt for samples and decode timing (default {d.new_tokens})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"sampling seed (default {d.seed})")
    parser.add_argument("--repeats", type=int, default=d.repeats, help=f"timing repeats, median taken (default {d.repeats})")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..training.card import CardOptions, build_card

    for name in ("seq", "windows", "batch", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    apply_threads(args.threads)
    opts = CardOptions(seq=args.seq, windows=args.windows, batch=args.batch, new_tokens=args.new_tokens,
                       repeats=args.repeats, seed=args.seed)
    card = build_card(Path(args.checkpoint), Path(args.data), opts)
    h = card["heldout"]
    print(f"held-out loss {h['loss']:.3f} (ppl {h['perplexity']:.1f}) vs unigram {h['unigram_loss']:.3f} "
          f"(ppl {h['unigram_perplexity']:.1f}); worst max load violation "
          f"{card['expert_balance']['max_violation']:.3f}")
    if card["dspark"]:
        print("DSpark mean accepted length " + json.dumps({k: round(card['dspark'][k]['mean_accepted_length'], 3)
                                                            for k in ('T=0', 'T=1')}))
    print(f"wrote {Path(args.checkpoint) / 'MODEL_CARD.md'}, card.json, loss_curve.png")
    return 0
