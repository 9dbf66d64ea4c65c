"""`python -m engine card`: measure a checkpoint on its prepared corpus and write MODEL_CARD.md beside it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..request.sampling import check_repetition
from ..spec.config import load_config
from ..spec.errors import InputError
from ..training.card_render import dspark_runs, readme_table
from .arg_checks import check_at_most
from .run_args import add_config_options, apply_threads, config_from_args

HELP = "measure a trained checkpoint (held-out loss vs unigram, expert balance, Engram gates, DSpark and greedy " \
       "text quality on held-out prompts, samples) and write MODEL_CARD.md, card.json and loss_curve.png into it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # training.card loads torch: only when this command's options are built
    from ..training.card import CardOptions
    parser.add_argument("checkpoint",
                        help="checkpoint directory (model.safetensors, config.json, log.csv, id_map.json)")
    parser.add_argument("--data", default="data/shakespeare", help="directory written by prepare_data")
    add_config_options(parser, CardOptions)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..training.card import CardOptions, build_card

    for name in ("seq", "windows", "batch", "repeats", "prompts", "quality_tokens"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.new_tokens < 2:  # the first token comes from the prefill: decode speed needs a second one
        raise InputError(f"--new-tokens must be at least 2 (decode speed is measured after the first token), "
                         f"got {args.new_tokens}")
    check_repetition(args.repetition_penalty, args.no_repeat_ngram, names=("--repetition-penalty", "--no-repeat-ngram"))
    apply_threads(args.threads)
    opts = config_from_args(CardOptions, args)
    check_lengths(args)
    card = build_card(Path(args.checkpoint), Path(args.data), opts)
    h = card["heldout"]
    print(f"held-out loss {h['loss']:.3f} (ppl {h['perplexity']:.1f}) vs unigram {h['unigram_loss']:.3f} "
          f"(ppl {h['unigram_perplexity']:.1f}); {h['bits_per_byte']:.3f} bits per byte; worst max load violation "
          f"{card['expert_balance']['max_violation']:.3f}")
    if card["dspark"]:
        print("DSpark mean accepted length " + json.dumps({k: round(card['dspark'][k]['mean_accepted_length'], 3)
                                                            for k in dspark_runs(card['dspark'])}))
    print(f"wrote {Path(args.checkpoint) / 'MODEL_CARD.md'}, card.json, loss_curve.png; the README's table:")
    print(readme_table(card), end="")
    return 0


def check_lengths(args: argparse.Namespace) -> None:
    """--seq and --new-tokens within the checkpoint's context (its config.json), before anything is measured
    (without a config.json, the card's own input check lists everything that is missing)."""
    config = Path(args.checkpoint) / "config.json"
    if not config.is_file():
        return
    max_seq_len = load_config(config).max_seq_len
    check_at_most(args.seq, max_seq_len, "--seq", "the checkpoint's max_seq_len")
    check_at_most(args.new_tokens, max_seq_len - 1, "--new-tokens", "the checkpoint's max_seq_len - 1")
    check_at_most(args.quality_tokens, max_seq_len - 1, "--quality-tokens", "the checkpoint's max_seq_len - 1")
