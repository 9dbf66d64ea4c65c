"""Options shared by commands: the training schedule and run control (train, train_drafter), torch threads (all)."""
from __future__ import annotations

import argparse


def add_schedule_arguments(parser: argparse.ArgumentParser, d, seq_help: str = "tokens per sequence") -> None:
    """--steps --batch --seq --lr --min-lr --warmup, defaulting to the config object `d`."""
    parser.add_argument("--steps", type=int, default=d.steps, help=f"total optimizer steps (default {d.steps})")
    parser.add_argument("--batch", type=int, default=d.batch, help=f"sequences per step (default {d.batch})")
    parser.add_argument("--seq", type=int, default=d.seq, help=f"{seq_help} (default {d.seq})")
    parser.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    parser.add_argument("--min-lr", type=float, default=d.min_lr, help=f"final learning rate (default {d.min_lr})")
    parser.add_argument("--warmup", type=int, default=d.warmup, help=f"warmup steps (default {d.warmup})")


def add_run_arguments(parser: argparse.ArgumentParser, d, resume_help: str, export_help: str) -> None:
    """--save-every --seed --threads --resume --export --no-progress."""
    parser.add_argument("--save-every", type=int, default=d.save_every, help=f"checkpoint period (default {d.save_every})")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--resume", action="store_true", help=resume_help)
    parser.add_argument("--export", metavar="DIR", help=export_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (the CSV log is still written)")


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads from a --threads value; None keeps torch's choice."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    import torch
    torch.set_num_threads(threads)
