"""Options shared by commands: options derived from a config dataclass, run control (train, train_drafter), threads,
dtypes."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..spec.errors import InputError
from .arg_checks import check_seed, check_threads

DTYPES = ("float32", "bfloat16")   # --dtype of generate and bench
EXPERTS = ("device", "host")       # --experts of generate and bench (engine.model.options.EXPERT_PLACEMENTS)


def add_config_options(parser: argparse.ArgumentParser, config_cls) -> None:
    """One option per field of `config_cls` declared with training.fields.option, in field order:
    `--name-with-dashes` (or the field's flag), typed and defaulted by the field, its help + the default."""
    for f in fields(config_cls):
        if "help" not in f.metadata:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        parser.add_argument(flag, dest=f.name, metavar=flag.lstrip("-").replace("-", "_").upper(),
                            type=type(f.default), default=f.default, help=f"{f.metadata['help']} (default {f.default})")


def config_from_args(config_cls, args: argparse.Namespace):
    """`config_cls` from the parsed options add_config_options added; other fields keep their defaults. A seed
    option is checked here, by its flag (the config classes leave its range to the generators)."""
    chosen = [f for f in fields(config_cls) if "help" in f.metadata]
    for f in chosen:
        if f.name == "seed":
            check_seed(getattr(args, f.name), f.metadata.get("flag", "--seed"))
    return config_cls(**{f.name: getattr(args, f.name) for f in chosen})


def add_run_arguments(parser: argparse.ArgumentParser, resume_help: str, export_help: str) -> None:
    """--threads --resume --export --no-progress."""
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--resume", action="store_true", help=resume_help)
    parser.add_argument("--export", metavar="DIR", help=export_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (the CSV log is still written)")


def add_experts_argument(parser: argparse.ArgumentParser) -> None:
    """--experts device|host: where the routed experts live (engine.placement)."""
    parser.add_argument("--experts", choices=EXPERTS, default="device",
                        help="host: the routed experts stay in host memory and run on the CPU for the tokens routed "
                             "to them, everything else on --device (one GPU + host RAM; one process, no "
                             "--cuda-graphs / --compile); device: every weight on --device (default)")


def check_experts(experts: str, graphed: bool) -> None:
    """--experts host with --cuda-graphs or --compile, refused before any work: the host round trip of each MoE layer
    cannot be captured or compiled."""
    if experts == "host" and graphed:
        raise InputError("--experts host runs the routed experts on the host, a round trip a CUDA graph or a "
                         "compiled step cannot hold: leave out --cuda-graphs and --compile, or use --experts device")


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads from a --threads value (1..the CPU count); None keeps torch's choice."""
    if check_threads(threads) is None:
        return
    import torch  # only when a command sets its threads: the CLI imports this module for every command
    torch.set_num_threads(threads)
