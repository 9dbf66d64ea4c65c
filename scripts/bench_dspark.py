"""DSpark against plain decoding on the shipped model: per held-out prompt, tokens/s ratios, accepted length.

    .venv/bin/python scripts/bench_dspark.py [--repeats 5] [--new-tokens 64] [--prompts 8] [--threads 1]
        [--temperature 0] [--repetition-penalty 1] [--checkpoint checkpoints/default] [--data data/shakespeare]
        [--phase 0.5] [--trace] [--compile] [--json OUT] [--results OUT]

The prompts are the model card's (engine.training.card_prompts: speech openings spread evenly over the held-out works
of the prepared corpus, which no training step saw); --phase P takes others from the same works, the opening at
(i + P) / count of the way through them (the card's P is 0.5), so a choice of prompts that suits the drafter is
checked against fresh ones. One process, one thread: every repeat runs each prompt in the
three modes back to back (plain, DSpark with the auto schedule, DSpark verifying all drafts; the order rotates with
the repeat), so a change of machine load reaches the modes of a pair alike; the ratios are per pair (mode / plain
of the same prompt and repeat) and the table shows their median and range. Decode tokens/s counts the tokens after
the first (which the prefill makes) per second of decode; the CPU-time ratios compare whole calls (prefill
included, alike in every mode) in this thread's CPU seconds, which other work on the machine does not stretch.
The auto schedule's table is this machine's, profiled on first use (engine.dspark.profile). The load average is
printed before and after: other work on the machine slows every mode, but not alike (a DSpark step reads more
weights), so compare ratios measured at similar loads.

At T = 0 (the default) every mode must give the same tokens (the `identical` column). --temperature T samples, with
the repeat's number as the seed in every mode: DSpark keeps the target's distribution but not its tokens, so the
modes decode different text (the column reads `no` by design) and a prompt's ratios vary with what each mode drew;
the repeats draw other text, which their median averages over. --repetition-penalty P decodes under that penalty in
every mode (lossless too: at T = 0 the outputs stay identical).

--trace adds two modes to each round: plain decoding and DSpark's auto schedule, each recording the Inspect page's
trace (every layer, attention, top-5 logits and the logit lens, DSpark's drafts and verdicts). A second table gives
each one's trace overhead per pair (the same prompt and repeat, untraced beside it): the whole call's wall time
traced / untraced, and decode's step time traced / untraced; traced and untraced runs must give the same tokens.

--compile runs every mode's decode steps through torch.compile (plain steps; DSpark's verify blocks, drafts and the
auto schedule's plain steps): the ratios then compare compiled DSpark with compiled plain decoding. The warm-up
compiles each mode's graphs first (minutes the first time; inductor's disk cache makes later runs quicker).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("plain", "auto", "all")
TRACED = ("plain traced", "auto traced")          # --trace: the Inspect page's trace on plain decoding and auto
RATIOS = ("auto", "all", "auto_cpu", "all_cpu")   # mode / plain in tokens/s, plain / mode in CPU seconds


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "default"))
    p.add_argument("--data", default=str(ROOT / "data" / "shakespeare"), help="the prepared corpus (held-out works)")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts (the card's rule)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every mode (each repeat seeded with its number)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="every mode's repetition penalty (1 = off)")
    p.add_argument("--phase", type=float, default=0.5,
                   help="which held-out speech openings: the one at (i + PHASE) / count of the way through the "
                        "held-out works (0.5, the default, is the model card's; another phase gives fresh ones)")
    p.add_argument("--trace", action="store_true", help="add traced plain and auto runs and their trace overhead")
    p.add_argument("--compile", action="store_true", help="every mode through torch.compile (see above)")
    p.add_argument("--json", help="also write the per-run numbers to this file")
    p.add_argument("--results", help="also write the table as a results file (docs/results/dspark.json)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.new_tokens < 2 or args.prompts < 1 or args.threads < 1:
        p.error("--repeats, --prompts and --threads must be at least 1, --new-tokens at least 2")
    if not (0 <= args.temperature < float("inf")) or not (0 < args.repetition_penalty < float("inf")):
        p.error("--temperature must be a finite number of at least 0, --repetition-penalty a finite positive one")
    if not 0 <= args.phase < 1:
        p.error("--phase must lie in [0, 1)")
    return args


def held_out_prompts(engine, data: Path, count: int, phase: float = 0.5) -> list[str]:
    """Held-out prompts from the corpus the checkpoint was trained on, the card's at phase 0.5 (the card's checks:
    the corpus exists, and its ids mean what the checkpoint's do)."""
    from engine.spec.errors import InputError
    from engine.training.card import check_same_vocabulary
    from engine.training.card_prompts import heldout_prompts
    from engine.training.corpus import load_tokens
    if not (data / "tokens.safetensors").exists():
        raise SystemExit(f"error: {data} holds no prepared corpus (tokens.safetensors): run scripts/test.sh once, or "
                         f"python -m engine prepare_data --out {data}, to make it")
    try:
        check_same_vocabulary(engine, data)
    except InputError as e:
        raise SystemExit(f"error: {e}") from None
    return heldout_prompts(engine.tokenizer.decode(load_tokens(data)["heldout"].tolist()), count, phase=phase)


def run(engine, ids: list[int], mode: str, configs: dict, new_tokens: int, compiled: bool = False,
        sampling: dict | None = None, seed: int = 0) -> dict:
    """One generate call in `mode` (a MODES or TRACED name): its tokens, decode tokens/s, wall and CPU seconds,
    and DSpark's accepted length and steps."""
    from engine.request import GenerationRequest
    from engine.trace import Trace, TraceBudget
    base = mode.removesuffix(" traced")
    trace = Trace(TraceBudget(max_tokens=None, attention=True, lens=True)) if mode in TRACED else None
    request = GenerationRequest.of(new_tokens, stop_tokens=(), dspark=configs[base], compiled=compiled, seed=seed,
                                   trace=trace, **(sampling or {}))
    cpu, wall = time.thread_time(), time.perf_counter()
    res = engine.generate([ids], request)
    out = {"tokens": res.tokens[0], "tokens_per_s": res.decode_tokens_per_s, "cpu_s": time.thread_time() - cpu,
           "wall_s": time.perf_counter() - wall}
    if base != "plain":
        m = res.metrics
        out.update(accepted_length=m.mean_accepted_length, drafting_steps=m.steps, plain_steps=res.plain_steps)
    return out


def result_rows(prompts: list[str], runs: list[dict], sampled: bool = False) -> list[dict]:
    """Per prompt, and for all prompts together: plain tokens/s and each mode's ratios to plain (median, min, max
    over the repeats), accepted lengths, the auto schedule's plain steps and whether the tokens were identical."""
    from engine.bench.results_file import spread

    def ratios(mine, mode, key="tokens_per_s"):
        if key == "cpu_s":   # the same tokens in less CPU time: plain's seconds over the mode's
            return [r["plain"]["cpu_s"] / r[mode]["cpu_s"] for r in mine]
        return [r[mode][key] / r["plain"][key] for r in mine]
    rows, every = [], {key: [] for key in RATIOS}
    for i, prompt in enumerate(prompts):
        mine = [r for r in runs if r["prompt"] == i]
        got = {"auto": ratios(mine, "auto"), "all": ratios(mine, "all"), "auto_cpu": ratios(mine, "auto", "cpu_s"),
               "all_cpu": ratios(mine, "all", "cpu_s")}
        for key, xs in got.items():
            every[key] += xs
        same = all(r[m]["tokens"] == r["plain"]["tokens"] for r in mine for m in ("auto", "all"))
        rows.append({"prompt": prompt.replace(chr(10), " "),
                     "plain_tokens_per_s": statistics.median(r["plain"]["tokens_per_s"] for r in mine),
                     **{key: spread(got[key]) for key in RATIOS},
                     "accepted_length": {m: statistics.mean(r[m]["accepted_length"] for r in mine)
                                         for m in ("auto", "all")},
                     "auto_plain_steps": sum(r["auto"]["plain_steps"] for r in mine),
                     "auto_steps": sum(r["auto"]["plain_steps"] + r["auto"]["drafting_steps"] for r in mine),
                     "identical": "yes" if same else "no (sampled)" if sampled else "NO"})
    rows.append({"prompt": "all prompts", **{key: spread(every[key]) for key in RATIOS}})
    if any(TRACED[0] in r for r in runs):
        for i, row in enumerate(rows):
            row["trace_overhead"] = trace_overheads([r for r in runs if i == len(prompts) or r["prompt"] == i])
    return rows


def trace_overheads(runs: list[dict]) -> dict:
    """Per traced mode, over the runs' pairs (traced beside its untraced mode, same prompt and repeat): the whole
    call's wall time traced / untraced and decode's step time traced / untraced (spreads), and whether every pair
    gave the same tokens."""
    from engine.bench.results_file import spread
    out = {}
    for mode in TRACED:
        base = mode.removesuffix(" traced")
        out[base] = {"wall": spread([r[mode]["wall_s"] / r[base]["wall_s"] for r in runs]),
                     "decode": spread([r[base]["tokens_per_s"] / r[mode]["tokens_per_s"] for r in runs]),
                     "same_tokens": all(r[mode]["tokens"] == r[base]["tokens"] for r in runs)}
    return out


def overhead_table(rows: list[dict]) -> list[str]:
    """The Markdown table of the rows' trace overheads (--trace)."""
    def cell(s):
        return f"×{s['median']:.2f} (×{s['min']:.2f}–×{s['max']:.2f})"
    lines = ["| prompt | plain: wall | plain: decode step | auto: wall | auto: decode step | same tokens |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        o = row["trace_overhead"]
        same = "yes" if all(o[b]["same_tokens"] for b in ("plain", "auto")) else "NO"
        lines.append(f"| {row['prompt']} | {cell(o['plain']['wall'])} | {cell(o['plain']['decode'])} | "
                     f"{cell(o['auto']['wall'])} | {cell(o['auto']['decode'])} | {same} |")
    return lines


def table(prompts: list[str], runs: list[dict], sampled: bool = False) -> list[str]:
    """The Markdown table of result_rows."""
    rows = result_rows(prompts, runs, sampled)

    def cell(s):
        return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"
    lines = ["| prompt | plain tokens/s | auto / plain | all / plain | auto / plain, CPU time | all / plain, CPU time "
             "| accepted length auto / all | auto's plain steps | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows[:-1]:
        lines.append(f"| {row['prompt']} | {row['plain_tokens_per_s']:.1f} | "
                     f"{' | '.join(cell(row[k]) for k in RATIOS)} | "
                     f"{row['accepted_length']['auto']:.2f} / {row['accepted_length']['all']:.2f} | "
                     f"{row['auto_plain_steps']} of {row['auto_steps']} | {row['identical']} |")
    lines.append(f"| all prompts | | {' | '.join(cell(rows[-1][k]) for k in RATIOS)} | | | |")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from engine.bench.machine import machine_description
    from engine.bench.results_file import ResultsRecorder
    from engine.dspark.config import DSparkConfig
    from engine.dspark.profile import stored_table, table_path
    from engine.generation import Engine
    recorder = ResultsRecorder(args.results, "dspark", "scripts/bench_dspark.py", argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load(checkpoint=args.checkpoint)
    prompts = held_out_prompts(engine, Path(args.data), args.prompts, args.phase)
    if stored_table(engine.model) is None:
        print(f"profiling this machine's steps/s table into {table_path(engine.model)} ...", file=sys.stderr)
    configs = {"plain": None, "auto": DSparkConfig.from_settings("auto", model=engine.model),
               "all": DSparkConfig("all")}
    ids = [engine.encode_prompt(p) for p in prompts]
    sampling = {"temperature": args.temperature, "repetition_penalty": args.repetition_penalty}
    modes = MODES + TRACED if args.trace else MODES
    for mode in modes if args.compile else ("auto", "plain"):       # warm-up: every path once (compiled: every graph)
        run(engine, ids[0], mode, configs, args.new_tokens if args.compile else 8, args.compile, sampling)
    for prompt_ids in ids[1:] if args.compile else ():              # the auto schedule's plain steps, if it takes any
        run(engine, prompt_ids, "auto", configs, args.new_tokens, True, sampling)
    load_before, t0 = os.getloadavg(), time.perf_counter()
    runs = []
    for rep in range(args.repeats):
        for i, prompt_ids in enumerate(ids):
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            runs.append({"repeat": rep, "prompt": i,
                         **{mode: run(engine, prompt_ids, mode, configs, args.new_tokens, args.compile, sampling,
                                                seed=rep)
                            for mode in order}})
            print(f"\rrepeat {rep + 1}/{args.repeats}, prompt {i + 1}/{len(ids)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    load_after = os.getloadavg()
    penalty = f", repetition penalty {args.repetition_penalty:g}" if args.repetition_penalty != 1 else ""
    print(f"DSpark vs plain decoding, T = {args.temperature:g}{penalty}, {args.new_tokens} new tokens, "
          f"{args.repeats} interleaved repeats, "
          f"{args.checkpoint}{', every mode compiled (torch.compile)' if args.compile else ''}; "
          f"{machine_description('cpu')}, torch {torch.__version__}, {args.threads} thread(s); "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({time.perf_counter() - t0:.0f} s)")
    sps = configs["auto"].sps
    gamma = engine.args.dspark_block_size
    print(f"auto's table ({table_path(engine.model)}, CPU time): a verify forward of 1..{gamma + 1} tokens "
          f"{', '.join(f'{1000 / sps(s):.1f}' for s in range(1, gamma + 2))} ms, a draft step "
          f"{1000 * sps.draft_cost(1):.1f} ms")
    print("\n".join(table(prompts, runs, sampled=args.temperature > 0)))
    rows = result_rows(prompts, runs, sampled=args.temperature > 0)
    if args.trace:
        print("\ntrace overhead (traced / untraced, per pair):\n" + "\n".join(overhead_table(rows)))
    recorder.write(rows, args.threads, settings={
        "checkpoint": Path(args.checkpoint).name, "temperature": args.temperature,
        "repetition_penalty": args.repetition_penalty, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "compile": args.compile, "phase": args.phase, "trace": args.trace,
        "verify_ms": [1000 / sps(s) for s in range(1, gamma + 2)], "draft_ms": 1000 * sps.draft_cost(1)})
    if args.json:
        Path(args.json).write_text(json.dumps({"prompts": prompts, "runs": runs, "load_average": [load_before,
                                                                                                  load_after]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
