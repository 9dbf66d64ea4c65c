"""A full-width rehearsal on this machine's CPU: the release's per-token widths (configs/v4.1-flash-rehearsal.json:
only depth, expert count and Engram rows cut) from an official-format folder written by `engine quantize
--synthetic`, loaded lazily by Engine.load. Measures load time, prefill tokens/s, decode ms/step (plain, then
DSpark), peak RSS against `engine plan`'s prediction, and prefill at growing contexts. Every measurement runs in a
fresh process (`--worker`), so each peak (VmHWM) is its own.

    python scripts/rehearsal.py [--results docs/results/rehearsal.json] [--prompt 4096 --decode 32
                                 --contexts 4096,16384]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.bench.results_file import ResultsRecorder  # noqa: E402
from engine.plan.host_run import host_run_bytes  # noqa: E402
from engine.spec.config import load_config  # noqa: E402

CONFIG = ROOT / "configs" / "v4.1-flash-rehearsal.json"
FOLDER = ROOT / "checkpoints" / "v4.1-flash-rehearsal"
GIB = 2 ** 30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--folder", type=Path, default=FOLDER, help="the synthetic official folder (written if absent)")
    p.add_argument("--prompt", type=int, default=4096, help="prompt tokens of the main run")
    p.add_argument("--decode", type=int, default=32, help="decode steps, plain and then with DSpark")
    p.add_argument("--contexts", default="4096,16384",
                   help="prefill lengths of the long-context series, each in a fresh process ('' for none)")
    p.add_argument("--budget-s", type=float, default=900,
                   help="skip a context whose prefill, extrapolated from the last one, would take longer")
    p.add_argument("--results", type=Path, default=None, help="write docs/results/<name>.json")
    p.add_argument("--worker", choices=["run", "prefill"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    recorder = ResultsRecorder(args.results, "rehearsal", "scripts/rehearsal.py", argv)
    written = ensure_folder(args.config, args.folder)
    model_args = load_config(args.folder / "config.json")
    settings = {"config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else str(args.config),
                "prompt": args.prompt, "decode": args.decode, "checkpoint_bytes": written["bytes"],
                "write_s": written["seconds"], "layers": model_args.n_layers,
                "routed_experts": model_args.n_routed_experts, "draft_stages": model_args.n_draft_stages}
    main_run = in_fresh_process(args, "run", args.prompt)
    main_run["predicted"] = host_run_bytes(model_args, args.prompt)
    rows, notes = [{"measure": "main", **main_run}], []
    import torch

    def save() -> None:   # after every row: a series stopped half-way (hours at 16k) keeps what it measured
        recorder.write(rows, torch.get_num_threads(), settings=settings, notes=notes)

    save()
    previous = main_run
    for context in [int(c) for c in args.contexts.split(",") if c]:
        stop = too_much(model_args, context, previous, args.budget_s)
        if stop:
            notes.append(f"The series stops before {context:,} tokens: {stop}.")
            print(notes[-1], file=sys.stderr)
            break
        row = main_run if context == args.prompt else in_fresh_process(args, "prefill", context)
        row = {**row, "predicted": host_run_bytes(model_args, context)}
        rows.append({"measure": "prefill", **row})
        save()
        previous = row
        print(f"prefill {context:,}: {row['prefill_s']:.1f} s, peak {(row['peak'] - row['base']) / GIB:.2f} GiB "
              f"above start (plan {row['predicted']['total'] / GIB:.2f} GiB)", file=sys.stderr)
    report(rows, settings)
    save()
    return 0


def ensure_folder(config: Path, folder: Path) -> dict:
    """The synthetic checkpoint of `config` (seed 0) in `folder`: written unless it already holds exactly that."""
    from engine.checkpoint.synthetic import reuse_or_write
    t0 = time.perf_counter()
    _, written = reuse_or_write(config, folder)
    seconds = round(time.perf_counter() - t0, 1) if written else None   # None: reused
    if written:
        print(f"wrote {folder} in {seconds} s", file=sys.stderr)
    return {"bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors")), "seconds": seconds}


def too_much(model_args, context: int, previous: dict, budget_s: float) -> str:
    """Why a prefill of `context` tokens is not attempted ('' when it is): the plan's CPU figure beyond the memory
    available now, or its time, extrapolated linearly from the previous prefill, beyond the budget."""
    from engine.plan.memory_fit import available_memory
    need = host_run_bytes(model_args, context)
    free, bound = available_memory()
    if need["total"] > free:
        return (f"the plan puts its peak at {need['total'] / GIB:,.1f} GiB (working buffers "
                f"{need['working'] / GIB:,.1f} GiB), above the {free / GIB:,.1f} GiB available ({bound})")
    guess = previous["prefill_s"] * context / previous["tokens"]
    if guess > budget_s:
        return (f"its prefill would take about {guess / 60:,.0f} minutes on this machine (linear in the tokens from "
                f"{previous['prefill_s']:,.0f} s at {previous['tokens']:,}), beyond the {budget_s:,.0f} s budget")
    return ""


def in_fresh_process(args, kind: str, tokens: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--folder", str(args.folder),
               "--prompt", str(tokens), "--decode", str(args.decode)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if run.returncode:
        raise SystemExit(f"the {kind} worker at {tokens:,} tokens failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def worker(args) -> dict:
    """One measurement in this (fresh) process: load, then either the full run or one prefill."""
    import torch

    from engine.generation import DSparkConfig, Engine
    from engine.plan.memory_fit import process_memory
    from engine.request import GenerationRequest

    base = process_memory("VmRSS")
    t0 = time.perf_counter()
    engine = Engine.load(checkpoint=args.folder)
    load_s = time.perf_counter() - t0
    loaded = process_memory("VmRSS")
    load_peak = process_memory("VmHWM")
    vocab = engine.args.vocab_size
    prompt = torch.randint(3, min(vocab, 128000), (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    out = {"tokens": args.prompt, "load_s": round(load_s, 2), "base": base, "loaded": loaded, "load_peak": load_peak}

    def timed(request) -> tuple[list[float], list[int]]:
        stamps, t = [], time.perf_counter()
        result = engine.generate([prompt], request, on_token=lambda row, token, info: stamps.append(
            time.perf_counter() - t))
        return stamps, result.tokens[0]

    with torch.inference_mode():
        t0 = time.perf_counter()   # one-time work kept out of the timings: the C++ CPU kernels' build, fp32 head copy
        engine.generate([prompt[:8]], GenerationRequest.of(1, stop_tokens=()))
        out["warmup_s"] = round(time.perf_counter() - t0, 1)
        if args.worker == "prefill":
            stamps, _ = timed(GenerationRequest.of(1, stop_tokens=()))
            out["prefill_s"] = round(stamps[0], 2)
        else:
            stamps, tokens = timed(GenerationRequest.of(args.decode + 1, stop_tokens=()))
            out["prefill_s"] = round(stamps[0], 2)
            out["decode_ms"] = round(1000 * (stamps[-1] - stamps[0]) / (len(stamps) - 1), 1)
            spec, spec_tokens = timed(GenerationRequest.of(args.decode + 1, stop_tokens=(), dspark=DSparkConfig()))
            out["dspark_prefill_s"] = round(spec[0], 2)
            out["dspark_decode_ms"] = round(1000 * (spec[-1] - spec[0]) / (len(spec) - 1), 1)
            out["dspark_same_tokens"] = spec_tokens == tokens
            out["text"] = engine.tokenizer.decode(tokens)[:200]
    out["prefill_tokens_per_s"] = round(args.prompt / out["prefill_s"], 1)
    out["peak"] = max(process_memory("VmHWM"), process_memory("VmRSS"))
    return out


def report(rows: list[dict], settings: dict) -> None:
    for r in rows:
        plan = r["predicted"]["total"]
        grew = r["peak"] - r["base"]
        print(f"{r['measure']} {r['tokens']:,} tokens: load {r['load_s']} s, prefill {r['prefill_s']} s "
              f"({r['prefill_tokens_per_s']} tokens/s)"
              + (f", decode {r['decode_ms']} ms/step, DSpark {r['dspark_decode_ms']} ms/token" if "decode_ms" in r
                 else "")
              + f"; peak above start {grew / GIB:.2f} GiB vs plan {plan / GIB:.2f} GiB "
                f"({100 * (grew - plan) / plan:+.1f} %)", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
