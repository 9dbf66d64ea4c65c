"""`python -m engine continuations`: the target's continuations of training-text prompts (drafter data)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..training.corpus import load_tokens
from .arg_checks import check_output_file, check_seed
from .run_args import apply_threads

HELP = ("write a checkpoint's own continuations (greedy, or sampled with --temperature; under --repetition-penalty) "
        "of random training-text prompts: sequence-level distillation data for `train_drafter --continuations`")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # training.continuations loads torch: only when this command's options are built
    from ..training.continuations import ContinuationSpec
    d = ContinuationSpec()
    parser.add_argument("--checkpoint", required=True, help="the trained backbone (directory with model.safetensors, "
                        "config.json, id_map.json)")
    parser.add_argument("--data", default="data/shakespeare", help="directory written by prepare_data")
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--sequences", type=int, default=d.sequences, help=f"continuations (default {d.sequences})")
    parser.add_argument("--prompt-len", type=int, default=d.prompt_len,
                        help=f"training-text tokens before each (default {d.prompt_len})")
    parser.add_argument("--new-tokens", type=int, default=d.new_tokens,
                        help=f"tokens generated after each prompt (default {d.new_tokens})")
    parser.add_argument("--batch", type=int, default=d.batch, help=f"prompts decoded together (default {d.batch})")
    parser.add_argument("--seed", type=int, default=d.seed, help="picks the prompts (and seeds sampled draws)")
    parser.add_argument("--temperature", type=float, default=d.temperature,
                        help="0 = greedy continuations (default); above 0, sampled at this temperature")
    parser.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty,
                        help="decode under this repetition penalty (default 1 = off; the Inspect page uses 1.4)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..generation import Engine
    from ..training.card import check_same_vocabulary
    from ..training.continuations import ContinuationSpec, make_continuations, save_continuations

    apply_threads(args.threads)
    check_seed(args.seed)
    check_output_file(args.out, "--out")  # written after every continuation is made
    spec = ContinuationSpec(args.sequences, args.prompt_len, args.new_tokens, args.batch, args.seed, args.temperature,
                            args.repetition_penalty)
    train = load_tokens(args.data)["train"]
    engine = Engine.load(checkpoint=args.checkpoint)
    check_same_vocabulary(engine, Path(args.data))

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} continuations", end="", file=sys.stderr, flush=True)

    rows = make_continuations(engine, train, spec, progress)
    print(file=sys.stderr)
    path = save_continuations(args.out, rows, spec, args.checkpoint)
    decoding = "greedy" if spec.temperature == 0 else f"sampled at T = {spec.temperature:g}"
    if spec.repetition_penalty != 1:
        decoding += f", repetition penalty {spec.repetition_penalty:g}"
    print(f"wrote {path}: {rows.shape[0]} rows of {rows.shape[1]} tokens ({spec.prompt_len} prompt + "
          f"{spec.new_tokens} {decoding})")
    return 0
