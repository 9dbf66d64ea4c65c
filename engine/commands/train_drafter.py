"""`python -m engine train_drafter`: train a checkpoint's DSpark drafter with its backbone frozen."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..spec.errors import InputError
from ..text.vocab import ID_MAP_NAME
from ..training.corpus import load_tokens
from .run_args import add_config_options, add_run_arguments, apply_threads, config_from_args

HELP = ("train the DSpark drafter (mtp.*) of a trained checkpoint with the backbone frozen: block cross-entropy "
        "through the Markov head, confidence head on the analytical acceptance target")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # training.train_drafter loads torch: only when this command's options are built
    from ..training.train_drafter import DrafterTrainConfig
    parser.add_argument("--checkpoint", required=True, help="trained backbone (directory with model.safetensors, "
                        "config.json, id_map.json), e.g. the backbone run's --out")
    parser.add_argument("--data", default="data/shakespeare", help="directory written by prepare_data")
    parser.add_argument("--out", required=True, help="the drafter run's directory (not the backbone's)")
    add_config_options(parser, DrafterTrainConfig)
    parser.add_argument("--continuations", metavar="FILE", nargs="+",
                        help="continuations of the target (`python -m engine continuations`; several files are "
                             "pooled, cut to the shortest rows) to train on next to the corpus: at T=0 verification "
                             "follows exactly the greedy ones")
    parser.add_argument("--init-drafter", metavar="CKPT",
                        help="start from the drafter (mtp.* tensors) of another checkpoint of the same config, e.g. "
                             "one trained on an earlier snapshot of the backbone (default: the checkpoint's own)")
    add_run_arguments(parser, resume_help="continue the drafter run saved in --out",
                      export_help="after training, write the shippable bf16 checkpoint (backbone + trained "
                                  "drafter, config.json, id_map.json, log.csv, drafter_log.csv) to DIR")


def run(args: argparse.Namespace) -> int:
    # the engine and the trainer load torch: the CLI imports every command module for its help line
    from ..checkpoint.store import load_weights
    from ..generation import Engine
    from ..model.options import EngineOptions
    from ..training.continuations import pool_continuations
    from ..training.train_drafter import DrafterTrainConfig, DrafterTrainer

    apply_threads(args.threads)
    cfg = config_from_args(DrafterTrainConfig, args)  # the training flags, before any work
    if args.init_drafter and args.resume:
        raise InputError("--init-drafter starts a new drafter run; it cannot be combined with --resume")
    engine = Engine.load(checkpoint=args.checkpoint, options=EngineOptions(quant_sim=False, act_quant=False))
    if args.init_drafter:
        load_weights(engine.model, args.init_drafter, prefix="mtp.")
    continuations = None
    if args.continuations:
        continuations = pool_continuations(args.continuations, engine.args.vocab_size, cfg.seq + 1)
    ckpt = Path(args.checkpoint)
    ckpt_dir = ckpt if ckpt.is_dir() else ckpt.parent
    trainer = DrafterTrainer(engine.model, cfg, load_tokens(args.data), args.out,
                             id_map_file=ckpt_dir / ID_MAP_NAME, backbone_log=ckpt_dir / "log.csv", resume=args.resume,
                             continuations=continuations)
    rows = trainer.run(progress=not args.no_progress)
    if rows:
        last = rows[-1]
        print(f"step {last['step']}: draft CE {last['ce']:.4f}, confidence BCE {last['confidence_loss']:.4f}, "
              f"predicted acceptance {last['predicted_acceptance']:.3f} vs target {last['target_acceptance']:.3f}; "
              f"run in {args.out}")
    if args.export:
        file = trainer.export(args.export)
        print(f"exported {file} ({file.stat().st_size / 1e6:.1f} MB)")
    return 0
