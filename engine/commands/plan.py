"""`python -m engine plan CONFIG_OR_CHECKPOINT`: where every part of the model goes on N GPUs + host, and if it fits."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..accounting.accounting import GIB, account
from ..bench.results_file import ResultsRecorder
from ..plan.fit import MAX_GPUS as FIT_GPUS
from ..plan.fit import Option, contexts_to_try, fit_options, impossible_counts
from ..plan.memory_plan import (
    EXPERT_PLACEMENTS,
    HOST_WORKING_FORMULA,
    WORKING_FORMULA,
    Hardware,
    MemoryPlan,
    Part,
    Verdict,
    context_label,
    memory_plan,
)
from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError, MissingFileError
from ..spec.presets import resolve_config
from .arg_checks import check_at_least, check_at_most, check_finite

MAX_GPUS = 4096  # the plan lists every GPU; more than a few thousand is no machine this engine is planned for
HELP = ("print a memory plan: weights, Engram, KV caches and buffers placed on N GPUs and the host, with a verdict; "
        "--fit lists the configurations that fit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Hardware()
    parser.add_argument("config", metavar="CONFIG_OR_CHECKPOINT",
                        help="a preset name from configs/, a config.json path, "
                             "or a checkpoint folder (its config.json)")
    parser.add_argument("--gpus", type=int, help=f"number of GPUs (default {d.gpus}; 1 with --experts host)")
    parser.add_argument("--gpu-mem", type=float, action="append",
                        help=f"GiB per GPU (default {d.gpu_mem_gib:g}); with --fit it may be given more than once, "
                             f"one search per size")
    parser.add_argument("--host-mem", type=float, default=d.host_mem_gib,
                        help=f"host RAM in GiB (default {d.host_mem_gib:g})")
    parser.add_argument("--experts", choices=EXPERT_PLACEMENTS,
                        help="where the routed experts (backbone and drafter) live: 'device' partitions them over "
                             "the GPUs; 'host' keeps them in host RAM, computed on the CPU, beside one GPU that "
                             "holds the rest (default device; --fit tries both)")
    parser.add_argument("--fit", action="store_true",
                        help=f"list the configurations that fit, fewest GPUs first: every GPU count up to "
                             f"--max-gpus that the parallel layout can split the config over (= the TP/EP degree), "
                             f"each expert placement, and the longest context of {context_label(4096)} … the "
                             f"config's maximum (or --context) that fits")
    parser.add_argument("--max-gpus", type=int, default=FIT_GPUS,
                        help=f"with --fit, the most GPUs tried (default {FIT_GPUS})")
    parser.add_argument("--context", type=int,
                        help=f"tokens per sequence (default {d.context}; with --fit, the longest that fits)")
    parser.add_argument("--batch", type=int, default=d.batch, help=f"sequences served at once (default {d.batch})")
    parser.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk,
                        help=f"prompt tokens per prefill step, sizes the activations (default {d.prefill_chunk})")
    parser.add_argument("--reserve", type=float, default=d.reserve_gib,
                        help=f"GiB per GPU kept for CUDA context, buffers and allocator slack "
                             f"(default {d.reserve_gib:g})")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument("--results", metavar="OUT",
                        help="also write the plan's rows (per-GPU and host bytes, verdict) as a results file for "
                             "the docs (docs/results/plan.json; scripts/render_results.py renders it)")


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
    recorder = ResultsRecorder(args.results, "plan", "-m engine", uses_torch=False)   # command: sys.argv's
    model = load_model(args.config)
    accounting_bytes = account(model).checkpoint_bytes
    options, notes = (run_fit if args.fit else run_plan)(args, model, accounting_bytes)
    recorder.write([o.to_json() for o in options], None,
                   {"model": model.name or "model", "accounting_checkpoint_bytes": accounting_bytes,
                    "fit": args.fit, "batch": args.batch, "prefill_chunk": args.prefill_chunk,
                    "reserve_gib": args.reserve}, notes=notes)
    return 0


def run_plan(args: argparse.Namespace, model: ModelArgs, accounting_bytes: int) -> tuple[list[Option], list[str]]:
    """One plan, printed; its row and notes for a results file."""
    experts = args.experts or "device"
    hw = Hardware(gpus=args.gpus or (1 if experts == "host" else Hardware.gpus), gpu_mem_gib=gpu_sizes(args)[0],
                  host_mem_gib=args.host_mem, context=args.context or Hardware.context, batch=args.batch,
                  prefill_chunk=args.prefill_chunk, reserve_gib=args.reserve, experts=experts)
    plan = memory_plan(model, hw)
    if args.json:
        print(json.dumps({**plan.to_json(), "accounting_checkpoint_bytes": accounting_bytes}, indent=1))
    else:
        print("\n".join(render(plan, accounting_bytes)))
    return [Option(plan, (hw.context,))], list(plan.notes)


def run_fit(args: argparse.Namespace, model: ModelArgs, accounting_bytes: int) -> tuple[list[Option], list[str]]:
    """The configurations that fit, one search per --gpu-mem, printed; their rows and notes for a results file."""
    placements = (args.experts,) if args.experts else EXPERT_PLACEMENTS
    searches = [fit_options(model, gpu_mem, args.host_mem, args.max_gpus, args.context, args.batch,
                            args.prefill_chunk, args.reserve, placements) for gpu_mem in gpu_sizes(args)]
    not_tried = impossible_counts(model, args.max_gpus)
    name, contexts = model.name or "model", contexts_to_try(model, args.context)
    if args.json:
        print(json.dumps(fit_json(name, searches, not_tried, accounting_bytes, contexts), indent=1))
    else:
        print("\n".join(render_fit(name, searches, not_tried, accounting_bytes, contexts)))
    return [o for search in searches for o in search], [f"not tried: {not_tried}"] if not_tried else []


def gpu_sizes(args: argparse.Namespace) -> list[float]:
    return args.gpu_mem or [Hardware.gpu_mem_gib]


def check_arguments(args: argparse.Namespace) -> None:
    """Each hardware flag named when out of range, before the config is read."""
    if args.gpus is not None:
        check_at_most(check_at_least(args.gpus, 1, "--gpus"), MAX_GPUS, "--gpus", "the planner's stated cap")
        if args.fit:
            raise InputError("--fit tries every GPU count up to --max-gpus: give --max-gpus instead of --gpus")
    check_at_most(check_at_least(args.max_gpus, 1, "--max-gpus"), MAX_GPUS, "--max-gpus", "the planner's stated cap")
    if args.gpu_mem and len(args.gpu_mem) > 1 and not args.fit:
        raise InputError(f"--gpu-mem was given {len(args.gpu_mem)} times: more than one size needs --fit")
    for flag, value in (("--context", args.context), ("--batch", args.batch), ("--prefill-chunk", args.prefill_chunk)):
        if value is not None:
            check_at_least(value, 1, flag)
    for flag, value in (*(("--gpu-mem", v) for v in gpu_sizes(args)), ("--host-mem", args.host_mem)):
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
    return size(max(part.gpu)) if max(part.gpu) else "-"


def on_host(part: Part) -> str:
    return size(part.host) if part.host else "-"


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
    if hw.experts == "host":
        header += "; routed experts in host RAM"
    lines = [header, "", f"{'Weights (exact checkpoint bytes)':<33} {'checkpoint':>14} {'GPU max':>14} {'host':>14}"
                         f"   placement"]
    for p in plan.weights:
        lines.append(f"  {p.label:<31} {size(p.checkpoint):>14} {gpu_max(p):>14} {on_host(p):>14}   {p.rule}")
    once, host, replicated = plan.weights_on_gpus, plan.weights_on_host, plan.weights_replicated
    same = "equals" if plan.checkpoint_bytes == accounting_bytes == once + host else "DIFFERS FROM"
    total_gpu = max(sum(p.gpu[r] for p in plan.weights) for r in range(n))
    lines += [f"  {'total':<31} {size(plan.checkpoint_bytes):>14} {size(total_gpu):>14} {size(host):>14}",
              (f"    = {plan.checkpoint_bytes:,} B: on the GPUs once {size(once)} + on the host {size(host)}; "
               f"{same} the accounting layer's checkpoint bytes ({accounting_bytes:,} B)"),
              (f"    replicated tensors ({size(replicated)}) are held by every GPU: "
               f"{size(once + (n - 1) * replicated)} on all GPUs together"),
              "", f"{'Caches and buffers':<33} {'':>14} {'GPU max':>14}   rule"]
    for p in plan.runtime:
        lines.append(f"  {p.label:<31} {'':>14} {gpu_max(p):>14}   {p.rule}")
    lines.append("    working = " + ", ".join(f"{k} {size(v)}" for k, v in plan.working.items()))
    lines += [f"    {line}" for line in WORKING_FORMULA]
    if plan.host_working:
        lines.append("    host = " + ", ".join(f"{k} {size(v)}" for k, v in plan.host_working.items()))
        lines += [f"    {line}" for line in HOST_WORKING_FORMULA]
    lines += ["", "Verdict", *verdict_rows(plan.gpus)]
    experts = (f"routed experts {size(plan.experts_on_host)} + expert buffers {size(sum(plan.host_working.values()))}"
               f" + " if plan.experts_on_host else "")
    lines.append(f"  {'host':<12} {plan.host.text} ({experts}Engram pages touched ≤ {size(plan.engram_touched)} + "
                 f"loading staging {size(plan.staging)}; {size(plan.engram_mapped)} of Engram tables read from the "
                 "shards by row)")
    lines += ["", "Notes", *[f"  - {note}" for note in plan.notes], "", plan.summary()]
    return lines


def fit_heading(model: str, option: Option, contexts: tuple[int, ...]) -> str:
    hw = option.plan.hardware
    tried = (f"context {context_label(contexts[0])}" if len(contexts) == 1 else
             f"the longest context of {context_label(contexts[0])} … {context_label(contexts[-1])} that fits")
    return (f"{model}: what fits on GPUs of {hw.gpu_mem_gib:g} GiB with {hw.host_mem_gib:g} GiB host RAM "
            f"({tried}, batch {hw.batch})")


def render_fit(model: str, searches: list[tuple[Option, ...]], not_tried: str, accounting_bytes: int,
               contexts: tuple[int, ...]) -> list[str]:
    """One table per GPU size: each allowed GPU count × placement, fewest GPUs first, with its bytes and verdict."""
    lines: list[str] = []
    for options in searches:
        lines += [fit_heading(model, options[0], contexts), "",
                  f"  {'GPUs = TP/EP':<13} {'experts':<8} {'context':>7} {'per GPU (max)':>14} {'host RAM':>14}  "
                  f"{'Engram cached':<13}  verdict"]
        for o in options:
            p = o.plan
            cached = "-" if not p.engram_mapped else "whole" if p.engram_cached else "partly"
            lines.append(f"  {o.gpus:<13} {o.experts:<8} {context_label(p.hardware.context):>7} "
                         f"{size(o.per_gpu):>14} {size(p.host.need):>14}  {cached:<13}  {o.reason}")
        lines += ["", *fewest_lines(options), ""]
    if not_tried:
        lines.append(f"not tried: {not_tried}")
    same = all(o.plan.checkpoint_bytes == accounting_bytes for options in searches for o in options)
    lines.append(f"every row places the whole checkpoint, {accounting_bytes:,} B: "
                 f"{'equal to' if same else 'DIFFERS FROM'} the accounting layer's checkpoint bytes")
    return lines


def fewest_lines(options: tuple[Option, ...]) -> list[str]:
    """The fewest GPUs that fit, and the fewest with the experts on the devices where that is another option."""
    def line(what: str, o: Option) -> str:
        return f"  {what}: {o.label}, up to {context_label(o.plan.hardware.context)} context"
    fewest = next((o for o in options if o.fits), None)
    if fewest is None:
        return ["  nothing up to --max-gpus fits"]
    on_device = next((o for o in options if o.fits and o.experts == "device"), None)
    lines = [line("fewest GPUs that fit", fewest)]
    if on_device is not None and on_device is not fewest:
        lines.append(line("fewest with the experts on the devices", on_device))
    return lines


def fit_json(model: str, searches: list[tuple[Option, ...]], not_tried: str, accounting_bytes: int,
             contexts: tuple[int, ...]) -> dict:
    return {"model": model, "accounting_checkpoint_bytes": accounting_bytes, "contexts_tried": list(contexts),
            "not_tried": not_tried,
            "searches": [{"gpu_mem_gib": options[0].plan.hardware.gpu_mem_gib,
                          "host_mem_gib": options[0].plan.hardware.host_mem_gib,
                          "fewest_that_fit": next((o.label for o in options if o.fits), None),
                          "options": [o.to_json() for o in options]} for options in searches]}
