"""`python -m engine train`: train a V4.1 config on a prepared corpus with the engine's own modules."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..spec.config import load_config
from ..spec.errors import InputError
from ..text.engram_map import load_token_map
from ..text.tokenizer import NOISE_ID, load_tokenizer
from ..text.vocab import ID_MAP_NAME, IdMap
from ..training.corpus import load_tokens, require_corpus
from .run_args import add_config_options, add_run_arguments, apply_threads, config_from_args

HELP = "train a model of the V4.1 architecture on a prepared corpus (see prepare_data); checkpoints and resumes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # training.train loads torch: only when this command's options are built
    from ..training.train import TrainConfig
    parser.add_argument("--config", required=True, help="model config.json (e.g. configs/default-small.json)")
    parser.add_argument("--data", default="data/shakespeare", help="directory written by prepare_data")
    parser.add_argument("--out", required=True, help="checkpoint directory (e.g. checkpoints/default)")
    add_config_options(parser, TrainConfig)
    add_run_arguments(parser, resume_help="continue the run saved in --out",
                      export_help="after training, write the shippable bf16 checkpoint (model.safetensors, "
                                  "config.json, id_map.json, log.csv; no optimizer state) to DIR")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..training.train import TrainConfig, Trainer, describe

    apply_threads(args.threads)
    cfg = config_from_args(TrainConfig, args)  # the training flags, before any work
    model_args = load_config(args.config)
    data_dir = Path(args.data)
    if not data_dir.is_dir():
        require_corpus(data_dir)  # says how to prepare the corpus
    id_map = IdMap.load(data_dir / ID_MAP_NAME, load_tokenizer())
    check_vocabulary(model_args, id_map, args.config, data_dir / ID_MAP_NAME)
    engram_map = id_map.engram_token_map(load_token_map()) if model_args.has_engram else None
    trainer = Trainer(model_args, cfg, load_tokens(data_dir), args.out, engram_map=engram_map,
                      id_map_file=data_dir / ID_MAP_NAME, resume=args.resume)
    print(describe(trainer))
    rows = trainer.run(progress=not args.no_progress)
    if rows:
        last = rows[-1]
        heldout_loss = last.get("heldout_loss", float("nan"))
        print(f"step {last['step']}: train loss {last['train_loss']:.4f}, held-out loss {heldout_loss:.4f}, "
              f"{trainer.tokens:,} tokens in {trainer.elapsed:.0f} s; checkpoint in {args.out}")
    if args.export:
        file = trainer.export(args.export)
        print(f"exported {file} ({file.stat().st_size / 1e6:.1f} MB)")
    return 0


def check_vocabulary(model_args, id_map, config_path, id_map_path) -> None:
    """The config must be sized for the id map: same vocab_size, and DSpark's noise token in model ids."""
    noise = id_map.model_id(NOISE_ID)
    if id_map.vocab_size != model_args.vocab_size:
        raise InputError(f"{config_path}: vocab_size {model_args.vocab_size} differs from the {id_map.vocab_size} ids "
                         f"of {id_map_path}; set vocab_size to {id_map.vocab_size} "
                         f"and dspark_noise_token_id to {noise}")
    if model_args.has_dspark and model_args.dspark_noise_token_id != noise:
        raise InputError(f"{config_path}: dspark_noise_token_id is {model_args.dspark_noise_token_id}, but the noise "
                         f"token {NOISE_ID} is model id {noise} under {id_map_path}")
