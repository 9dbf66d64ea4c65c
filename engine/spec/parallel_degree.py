"""Which tensor/expert-parallel degrees a config allows, from the config alone (torch-free).

The engine's parallel layout (engine/parallel/shard.py, Layout) gives each of N ranks one equal, contiguous
block of the query heads, of the output groups and of the routed experts (target and drafter), so each of those
counts must be divisible by N. The vocabulary need not be: its blocks may differ by one row. The memory plan's
`--fit` search (engine/plan/fit.py) uses the same rule, without importing torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    from .config import ModelArgs


def split_counts(args: ModelArgs) -> dict[str, int]:
    """The counts that N ranks must divide evenly, by config field name."""
    counts = {"n_heads": args.n_heads, "o_groups": args.o_groups, "n_routed_experts": args.n_routed_experts}
    if args.has_dspark:
        counts["dspark_n_routed_experts"] = args.draft_n_routed_experts
    return counts


def uneven_counts(args: ModelArgs, ranks: int) -> list[str]:
    """The counts ('n_heads = 64') that `ranks` does not divide; empty when the split is possible."""
    return [f"{name} = {count}" for name, count in split_counts(args).items() if count % ranks]


def check_parallel_degree(args: ModelArgs, ranks: int) -> None:
    """Raise InputError naming every count that `ranks` ranks cannot split evenly."""
    uneven = uneven_counts(args, ranks)
    if uneven:
        raise InputError(f"config '{args.name or args.model_type}' cannot be split over {ranks} ranks: "
                         f"{', '.join(uneven)} must each be divisible by the number of ranks")


def parallel_degrees(args: ModelArgs, up_to: int) -> list[int]:
    """Every rank count from 1 to `up_to` that the layout can split this config over, smallest first."""
    return [n for n in range(1, up_to + 1) if not uneven_counts(args, n)]
