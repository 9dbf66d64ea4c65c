"""Before/after benchmark: the engine at a git revision against the working tree, interleaved in one run.

    .venv/bin/python scripts/bench_revision.py REV [--configs tiny-v4.1,tiny-v4,configs/default-small-3k.json]
        [--threads 1,2] [--runs 5] [--prompt-len 32] [--new-tokens 32] [--repeats 3] [--dtype float32|bfloat16]
        [--compile] [--bf16] [--json OUT] [--results OUT]

REV is checked out into a temporary detached `git worktree`, removed at the end (also on an error, Ctrl-C or
SIGTERM). Each run launches `python -m engine bench --json` once per side, config and thread count, each in a fresh
process with that side's source tree as its cwd and first on PYTHONPATH; within a run the two sides of a pair follow
each other (REV first on even runs, the working tree first on odd ones), so a busy machine slows both alike. The
weights are random-init: speed does not depend on their values. `configs/default-small-3k.json` is the shipped
model's config (checkpoints/default), passed as a file so that a revision from before that preset reads it too.
The table shows each side's median [min–max] tokens/s over the runs, the ratio of the medians (working tree / REV,
above 1 means the working tree is faster) and the range of the per-run pair ratios; a second one each side's trace
overhead on decode (traced / untraced step time as `engine bench` measures it, with the Inspect page's trace).

--compile adds `--compile` to the working tree's launches and a "decode compiled" row: the working tree's decode
through torch.compile (the opt-in transform, engine.graphs) against REV's eager decode, with the seconds each launch's
first compiled step took (inductor's cache on disk makes all but the first launch per config short). --bf16 adds a
third side, the working tree in bfloat16, launched next to the other two, and a second table: bfloat16 against the
working tree's float32 (--dtype) of the same runs; with both, the bfloat16 side compiles too and that table's
"decode compiled" row is compiled bfloat16 against compiled float32.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIRED_FLAGS = ("--config", "--json", "--threads", "--prompt-len", "--new-tokens", "--repeats")
PHASES = ("prefill", "decode")
COMPILED = "decode compiled"   # the --compile row: the working tree's compiled decode against REV's eager decode
# `engine bench --help`, with the location of the engine package printed first (so a side that imports the other
# side's code, for example through an editable install, is caught instead of measured)
PROBE = ("import runpy, sys, engine; print('engine package:', engine.__file__, flush=True); "
         "sys.argv = ['engine', 'bench', '--help']; runpy.run_module('engine', run_name='__main__')")


class BenchError(Exception):
    """A problem the user can act on; main() prints it as `error: ...` and exits with 2."""


def git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if run.returncode:
        raise BenchError(f"git {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout.strip()


def resolve_revision(rev: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except BenchError:
        raise BenchError(f"revision '{rev}' is not a commit in {ROOT} "
                         "(try a hash, a branch, a tag or HEAD~N)") from None


def describe_working_tree() -> str:
    dirty = git("status", "--porcelain", "--untracked-files=normal") != ""
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")


@contextmanager
def checked_out(commit: str):
    """A detached worktree of commit in a temporary folder; removed (and pruned from git's list) on the way out."""
    holder = Path(tempfile.mkdtemp(prefix="bench-revision-"))
    tree = holder / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(tree), commit)
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True, check=False)
        shutil.rmtree(holder, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True, check=False)


def side_env(tree: Path, threads: int) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads), **kernel_cache_env(tree)}


def kernel_cache_env(tree: Path) -> dict:
    """Where a side's CPU C++ kernels build. An engine that builds them under an fcntl lock from a copy of the source
    (engine.kernels.cpu_extension, `build.flock`) shares the working tree's cache safely. An older one builds from
    its own source path under torch's lock alone: in the shared cache it would rebuild the working tree's builds on
    every switch of side, and could be told its live build is a leftover, so it gets a cache folder of its own, beside
    its temporary worktree (removed with it)."""
    builder = tree / "engine" / "kernels" / "cpu_extension.py"
    if tree == ROOT or (builder.is_file() and "build.flock" in builder.read_text()):
        return {}
    return {"TORCH_EXTENSIONS_DIR": str(tree.parent / "torch_extensions")}


def bench_flags(tree: Path, label: str) -> set[str]:
    """The flags `engine bench` accepts in tree; an engine without bench, or one imported from elsewhere, is refused."""
    if not (tree / "engine" / "__main__.py").is_file():
        raise BenchError(f"{label} has no engine/__main__.py, so no `python -m engine bench` to time")
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=side_env(tree, 1), capture_output=True,
                         text=True, check=False, timeout=600)
    if run.returncode:
        last_line = (run.stderr.strip().splitlines() or ["no message"])[-1]
        raise BenchError(f"the engine at {label} has no usable `python -m engine bench` ({last_line})")
    location = Path(run.stdout.splitlines()[0].split(": ", 1)[1]).resolve()
    if tree.resolve() not in location.parents:
        raise BenchError(f"the engine for {label} was imported from {location}, not from {tree}")
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", run.stdout))
    missing = [flag for flag in REQUIRED_FLAGS if flag not in flags]
    if missing:
        raise BenchError(f"`engine bench` at {label} has no {', '.join(missing)}; this script needs "
                         f"{', '.join(REQUIRED_FLAGS)}")
    return flags


def dtype_arguments(flags: set[str], dtype: str, label: str) -> list[str]:
    """`--dtype` where the side has it; a bench without it measures float32 only (run_bench's fixed dtype)."""
    if "--dtype" in flags:
        return ["--dtype", dtype]
    if dtype != "float32":
        raise BenchError(f"`engine bench` at {label} has no --dtype flag, so it can only measure float32; "
                         f"run without --dtype {dtype} or pick a later revision")
    return []


def config_argument(spec: str) -> str:
    """A preset name stays a name (each side reads its own configs/); a file path becomes absolute (one file)."""
    if (ROOT / "configs" / f"{spec}.json").is_file():
        return spec
    path = Path(spec) if Path(spec).is_absolute() else ROOT / spec
    if not path.is_file():
        raise BenchError(f"--configs: '{spec}' is neither a preset in configs/ nor a config file")
    return str(path)


def config_notes(rev_tree: Path, configs: list[str], rev_label: str) -> list[str]:
    notes = []
    for spec in configs:
        ours, theirs = ROOT / "configs" / f"{spec}.json", rev_tree / "configs" / f"{spec}.json"
        if not ours.is_file():
            continue
        if not theirs.is_file():
            raise BenchError(f"the preset '{spec}' does not exist at {rev_label}; pass a config file path instead")
        if ours.read_text() != theirs.read_text():
            notes.append(f"note: configs/{spec}.json differs between {rev_label} and the working tree; "
                         "each side runs its own")
    return notes


def measure(tree: Path, label: str, command: list[str], threads: int) -> dict:
    run = subprocess.run(command, cwd=tree, env=side_env(tree, threads), capture_output=True, text=True, check=False,
                         timeout=3600)
    if run.returncode:
        raise BenchError(f"bench at {label} failed (exit {run.returncode}): {' '.join(command[1:])}\n"
                         f"{run.stderr.strip()[-3000:]}")
    start = run.stdout.find("{")
    if start < 0:
        raise BenchError(f"bench at {label} printed no JSON: {run.stdout.strip()[-500:]}")
    return json.loads(run.stdout[start:])


def bench_command(spec: str, threads: int, flags: set[str], label: str, a: argparse.Namespace, dtype: str,
                  compile_: bool = False) -> list[str]:
    return [sys.executable, "-m", "engine", "bench", "--json", "--config", config_argument(spec), "--threads",
            str(threads), "--prompt-len", str(a.prompt_len), "--new-tokens", str(a.new_tokens), "--repeats",
            str(a.repeats), *dtype_arguments(flags, dtype, label), *(["--compile"] if compile_ else [])]


def sides_of(a: argparse.Namespace) -> list[str]:
    """rev and tree, and with --bf16 the working tree in bfloat16 ("tree_bf16")."""
    return ["rev", "tree", *(["tree_bf16"] if a.bf16 else [])]


def interleaved_runs(trees: dict, labels: dict, flags: dict, a: argparse.Namespace) -> list[dict]:
    """runs × configs × threads groups; within a group the order of the sides alternates from run to run."""
    records, sides = [], sides_of(a)
    for run in range(a.runs):
        for spec in a.configs:
            for threads in a.threads:
                for side in sides if run % 2 == 0 else sides[::-1]:
                    dtype = "bfloat16" if side == "tree_bf16" else a.dtype
                    command = bench_command(spec, threads, flags[side], labels[side], a, dtype,
                                            compile_=a.compile and side in ("tree", "tree_bf16"))
                    result = measure(trees[side], labels[side], command, threads)
                    record = {"run": run, "side": side, "config": spec, "threads": threads,
                              "prefill": result["prefill_tokens_per_s"], "decode": result["decode_tokens_per_s"],
                              "bench": result}
                    if "compile" in result:
                        record[COMPILED] = result["compile"]["decode_tokens_per_s_compiled"]
                        record["first_compiled_step_s"] = result["compile"]["first_compiled_step_s"]
                    records.append(record)
                    extra = f", compiled {record[COMPILED]:,.1f}" if COMPILED in record else ""
                    print(f"  run {run + 1}/{a.runs} {spec} {threads} thread(s) {labels[side]}: prefill "
                          f"{result['prefill_tokens_per_s']:,.1f}, decode {result['decode_tokens_per_s']:,.1f}"
                          f"{extra} tokens/s", file=sys.stderr, flush=True)
    return records


def launches(records: list[dict], side: str, spec: str, threads: int) -> list[dict]:
    """One side's records of a config and thread count, in run order."""
    return [r for r in records if (r["side"], r["config"], r["threads"]) == (side, spec, threads)]


def summary_rows(records: list[dict], a: argparse.Namespace, base: str = "rev", other: str = "tree",
                 compiled: bool = False, base_compiled: bool = False) -> list[dict]:
    """One row per config, thread count and phase: base and other side's median [min–max], the ratio of the
    medians (other / base) and the range of the per-run pair ratios. compiled adds the COMPILED row (other's
    compiled decode against base's decode, or with base_compiled against base's compiled decode)."""
    rows = []
    phases = [(phase, phase) for phase in PHASES]
    if compiled:
        phases.append((COMPILED, COMPILED if base_compiled else "decode"))
    for spec in a.configs:
        for threads in a.threads:
            for phase, base_phase in phases:
                def rates_of(side: str, key: str) -> list[float]:  # in run order, so zip pairs a run's launches
                    return [r[key] for r in launches(records, side, spec, threads)]
                rates = {"base": rates_of(base, base_phase), "other": rates_of(other, phase)}
                pairs = [o / b for b, o in zip(rates["base"], rates["other"])]
                medians = {side: statistics.median(rates[side]) for side in rates}
                rows.append({"config": spec, "threads": threads, "phase": phase,
                             **{f"{side}_{stat}": fn(rates[side]) for side in rates
                                for stat, fn in (("median", statistics.median), ("min", min), ("max", max))},
                             "ratio": medians["other"] / medians["base"], "pair_ratio_min": min(pairs),
                             "pair_ratio_max": max(pairs)})
    return rows


def machine_line() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        cpu = ""
    return (f"machine: {cpu or 'unknown CPU'}, {os.cpu_count()} cores; torch {metadata.version('torch')}, "
            f"python {sys.version.split()[0]}")


def table_lines(rows: list[dict], base_label: str, other_label: str) -> list[str]:
    def cell(row: dict, side: str) -> str:
        return f"{row[side + '_median']:,.1f} [{row[side + '_min']:,.1f}–{row[side + '_max']:,.1f}]"

    head = ("config", "threads", "phase", f"{base_label} tokens/s", f"{other_label} tokens/s", "ratio",
            "per-run ratios")
    body = [(r["config"], str(r["threads"]), r["phase"], cell(r, "base"), cell(r, "other"), f"{r['ratio']:.2f}",
             f"[{r['pair_ratio_min']:.2f}–{r['pair_ratio_max']:.2f}]") for r in rows]
    return aligned(head, body)


def aligned(head: tuple, body: list[tuple]) -> list[str]:
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    return ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in (head, *body)]


def overhead_rows(records: list[dict], a: argparse.Namespace) -> list[dict]:
    """Per config and thread count, each side's trace overhead on decode (`engine bench`'s trace_overhead_decode:
    traced / untraced step time with the Inspect page's trace) over the launches: median, min, max (None where
    the side's bench does not report it)."""
    rows = []
    for spec in a.configs:
        for threads in a.threads:
            row = {"config": spec, "threads": threads}
            for side in ("rev", "tree"):
                values = [r["bench"]["trace_overhead_decode"] for r in launches(records, side, spec, threads)
                          if "trace_overhead_decode" in r["bench"]]
                row[side] = {"median": statistics.median(values), "min": min(values), "max": max(values)} \
                    if values else None
            rows.append(row)
    return rows


def overhead_lines(rows: list[dict], labels: dict) -> list[str]:
    def cell(stats: dict | None) -> str:
        return "not reported" if stats is None else f"x{stats['median']:.2f} [x{stats['min']:.2f}–x{stats['max']:.2f}]"

    head = ("config", "threads", f"{labels['rev']} trace overhead", f"{labels['tree']} trace overhead")
    return aligned(head, [(r["config"], str(r["threads"]), cell(r["rev"]), cell(r["tree"])) for r in rows])


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev", help="git revision to compare the working tree against (hash, branch, tag, HEAD~N)")
    p.add_argument("--configs", default="tiny-v4.1,tiny-v4,configs/default-small-3k.json",
                   help="comma-separated presets or config files")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    p.add_argument("--runs", type=int, default=5, help="interleaved launches per side, config and thread count")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="`engine bench --repeats` inside each launch (default 3)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--compile", action="store_true",
                   help="add the working tree's decode through torch.compile against REV's eager decode")
    p.add_argument("--bf16", action="store_true",
                   help="add the working tree in bfloat16 and a table of it against the working tree's --dtype")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the per-run figures and the table as JSON")
    p.add_argument("--results", type=Path, metavar="OUT",
                   help="also write the tables as a results file (docs/results/revision.json)")
    a = p.parse_args(argv)
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    try:
        a.threads = [int(t) for t in a.threads.split(",") if t.strip()]
    except ValueError:
        p.error(f"--threads takes comma-separated whole numbers, not '{a.threads}'")
    if not a.configs or not a.threads or min(a.threads) < 1 or a.runs < 1:
        p.error("--configs and --threads need at least one entry, thread counts and --runs at least 1")
    if a.bf16 and a.dtype == "bfloat16":
        p.error("--bf16 compares bfloat16 with the working tree's --dtype: leave --dtype at float32")
    if a.json is not None and not a.json.resolve().parent.is_dir():
        p.error(f"--json: the folder of {a.json} does not exist")
    return a


def run_comparison(a: argparse.Namespace, recorder=None) -> int:
    commit = resolve_revision(a.rev)
    for spec in a.configs:  # a missing config file is named before anything is checked out
        config_argument(spec)
    labels = {"rev": f"{a.rev} ({commit[:7]})" if not commit.startswith(a.rev) else commit[:7],
              "tree": "working tree", "tree_bf16": "working tree bfloat16"}
    revisions = f"revisions: {labels['rev']} against the working tree at {describe_working_tree()}"
    sides = sides_of(a)
    with checked_out(commit) as rev_tree:
        trees = {"rev": rev_tree, "tree": ROOT, "tree_bf16": ROOT}
        flags = {side: bench_flags(trees[side], labels[side]) for side in sides[:2]}
        flags["tree_bf16"] = flags["tree"]
        notes = config_notes(rev_tree, a.configs, labels["rev"])
        without_dtype = [labels[side] for side in ("rev", "tree") if "--dtype" not in flags[side]]
        if without_dtype:
            notes.append(f"note: `engine bench` has no --dtype at {' and '.join(without_dtype)} (float32 only)")
        records = interleaved_runs(trees, labels, flags, a)
    rows = summary_rows(records, a, compiled=a.compile)
    settings = (f"settings: batch 1, prompt {a.prompt_len}, {a.new_tokens} new tokens, {a.dtype}, random-init "
                f"weights; {a.runs} interleaved launches per side, each `engine bench --repeats {a.repeats}`")
    lines = [revisions, machine_line(), settings, *notes,
             "tokens/s: median [min–max] over launches; ratio: working tree / REV of the medians", "",
             *table_lines(rows, labels["rev"], labels["tree"])]
    if a.compile:
        seconds = [r["first_compiled_step_s"] for r in records if "first_compiled_step_s" in r]
        lines += ["", f"{COMPILED}: the working tree's decode through torch.compile against {labels['rev']}'s eager "
                      f"decode; first compiled step per launch {statistics.median(seconds):,.1f} s median "
                      f"[{min(seconds):,.1f}–{max(seconds):,.1f}] (compiling, or loading inductor's cache)"]
    trace_rows = overhead_rows(records, a)
    lines += ["", "trace overhead on decode, each side's own (`engine bench`: traced / untraced step time, the Inspect "
                  "page's trace): median [min–max] over launches", "", *overhead_lines(trace_rows, labels)]
    bf16_rows = summary_rows(records, a, base="tree", other="tree_bf16", compiled=a.compile,
                             base_compiled=True) if a.bf16 else []
    if bf16_rows:
        lines += ["", f"bfloat16 against {a.dtype}, both the working tree, the same runs; ratio: bfloat16 / {a.dtype}",
                  "", *table_lines(bf16_rows, f"{a.dtype}", "bfloat16")]
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps({"revision": a.rev, "commit": commit, "labels": labels, "revisions": revisions,
                                      "machine": machine_line(), "settings": settings, "notes": notes,
                                      "runs": records, "table": rows, "trace_overhead": trace_rows,
                                      "bf16_table": bf16_rows}, indent=1))
    if recorder is not None:
        recorder.write(rows, a.threads, settings={"revision": a.rev, "commit": commit, "labels": labels,
                                                  "revisions": revisions, "settings": settings, "dtype": a.dtype},
                       tables={"trace_overhead": trace_rows, **({"bf16": bf16_rows} if bf16_rows else {})},
                       notes=notes)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_arguments(argv)
    recorder = None
    if a.results is not None:
        sys.path.insert(0, str(ROOT))
        from engine.bench.results_file import ResultsRecorder
        recorder = ResultsRecorder(a.results, "revision", "scripts/bench_revision.py", argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM unwinds like Ctrl-C: the worktree goes
    try:
        return run_comparison(a, recorder)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the temporary worktree was removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
