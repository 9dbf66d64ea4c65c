"""`python -m engine plan CONFIG_OR_CHECKPOINT`: where every part of the model goes on N GPUs + host, and if it fits."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..accounting.accounting import GIB, account
from ..plan.memory_plan import WORKING_FORMULA, Hardware, MemoryPlan, Part, Verdict, memory_plan
from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError, MissingFileError
from ..spec.presets import resolve_config
from .arg_checks import check_at_least, check_at_most, check_finite

MAX_GPUS = 4096  # the plan lists every GPU; more than a few thousand is no machine this engine is planned for
HELP = "print a memory plan: weights, Engram, KV caches and buffers placed on N GPUs and the host, with a verdict"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Hardware()
    parser.add_argument("config", metavar="CONFIG_OR_CHECKPOINT",
                        help="a preset name from configs/, a config.json path, "
                             "or a checkpoint folder (its config.json)")
    parser.add_argument("--gpus", type=int, default=d.gpus, help=f"number of GPUs (default {d.gpus})")
    parser.add_argument("--gpu-mem", type=float, default=d.gpu_mem_gib, help=f"GiB per GPU (default {d.gpu_mem_gib:g})")
    parser.add_argument("--host-mem", type=float, default=d.host_mem_gib,
                        help=f"host RAM in GiB (default {d.host_mem_gib:g})")
    parser.add_argument("--context", type=int, default=d.context, help=f"tokens per sequence (default {d.context})")
    parser.add_argument("--batch", type=int, default=d.batch, help=f"sequences served at once (default {d.batch})")
    parser.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk,
                        help=f"prompt tokens per prefill step, sizes the activations (default {d.prefill_chunk})")
    parser.add_argument("--reserve", type=float, default=d.reserve_gib,
                        help=f"GiB per GPU kept for CUDA context, buffers and allocator slack "
                             f"(default {d.reserve_gib:g})")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def load_model(spec: str) -> ModelArgs:
    """A checkpoint folder (its config.json), a config path, or a preset name."""
    path = Path(spec)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise MissingFileError(f"{path}: a checkpoint folder needs a config.json, and there is none")
        return load_config(config)
    return resolve_config(spec)


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    model = load_model(args.config)
    hw = Hardware(gpus=args.gpus, gpu_mem_gib=args.gpu_mem, host_mem_gib=args.host_mem, context=args.context,
                  batch=args.batch, prefill_chunk=args.prefill_chunk, reserve_gib=args.reserve)
    plan = memory_plan(model, hw)
    if args.json:
        out = plan.to_json()
        out["accounting_checkpoint_bytes"] = account(model).checkpoint_bytes
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(render(plan, account(model).checkpoint_bytes)))
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """Each hardware flag named when out of range, before the config is read."""
    check_at_most(check_at_least(args.gpus, 1, "--gpus"), MAX_GPUS, "--gpus", "the planner's stated cap")
    for flag, value in (("--context", args.context), ("--batch", args.batch), ("--prefill-chunk", args.prefill_chunk)):
        check_at_least(value, 1, flag)
    for flag, value in (("--gpu-mem", args.gpu_mem), ("--host-mem", args.host_mem)):
        if not check_finite(value, flag) > 0:
            raise InputError(f"{flag} must be a positive number of GiB, got {value}")
    if not check_finite(args.reserve, "--reserve") >= 0:
        raise InputError(f"--reserve must be >= 0 GiB, got {args.reserve}")


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (3 decimals)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.3f} {unit}"
    return f"{n:,.0f} B"


def gpu_max(part: Part) -> str:
    if not max(part.gpu):
        return "host" if part.host else "-"
    return size(max(part.gpu))


def verdict_rows(gpus: tuple[Verdict, ...]) -> list[str]:
    """One row per run of consecutive GPUs with the same verdict ('GPUs 0-7  fits: … (each)')."""
    rows, start = [], 0
    for i in range(1, len(gpus) + 1):
        if i == len(gpus) or gpus[i].text != gpus[start].text:
            name = f"GPU {start}" if i - start == 1 else f"GPUs {start}-{i - 1}"
            rows.append(f"  {name:<12} {gpus[start].text}" + (" (each)" if i - start > 1 else ""))
            start = i
    return rows


def render(plan: MemoryPlan, accounting_bytes: int) -> list[str]:
    hw, n = plan.hardware, plan.hardware.gpus
    header = (f"{plan.model}: {n} GPU(s) × {hw.gpu_mem_gib:g} GiB, host {hw.host_mem_gib:g} GiB; "
              f"context {hw.context:,} tokens × batch {hw.batch}")
    lines = [header, "", f"{'Weights (exact checkpoint bytes)':<33} {'checkpoint':>14} {'GPU max':>14}   placement"]
    for p in plan.weights:
        lines.append(f"  {p.label:<31} {size(p.checkpoint):>14} {gpu_max(p):>14}   {p.rule}")
    once, host, replicated = plan.weights_on_gpus, plan.weights_on_host, plan.weights_replicated
    same = "equals" if plan.checkpoint_bytes == accounting_bytes == once + host else "DIFFERS FROM"
    total_gpu = max(sum(p.gpu[r] for p in plan.weights) for r in range(n))
    lines += [f"  {'total':<31} {size(plan.checkpoint_bytes):>14} {size(total_gpu):>14}",
              (f"    = {plan.checkpoint_bytes:,} B: on the GPUs once {size(once)} + on the host {size(host)}; "
               f"{same} the accounting layer's checkpoint bytes ({accounting_bytes:,} B)"),
              (f"    replicated tensors ({size(replicated)}) are held by every GPU: "
               f"{size(once + (n - 1) * replicated)} on all GPUs together"),
              "", f"{'Caches and buffers':<33} {'':>14} {'GPU max':>14}   rule"]
    for p in plan.runtime:
        lines.append(f"  {p.label:<31} {'':>14} {gpu_max(p):>14}   {p.rule}")
    lines.append("    working = " + ", ".join(f"{k} {size(v)}" for k, v in plan.working.items()))
    lines += [f"    {line}" for line in WORKING_FORMULA]
    lines += ["", "Verdict", *verdict_rows(plan.gpus)]
    lines.append(f"  {'host':<12} {plan.host.text} (Engram pages touched ≤ {size(plan.engram_touched)} + "
                 f"loading staging {size(plan.staging)}; {size(plan.engram_mapped)} of Engram tables mapped)")
    lines += ["", "Notes", *[f"  - {note}" for note in plan.notes], "", plan.summary()]
    return lines
