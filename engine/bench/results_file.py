"""Results files: a measurement's rows with the command, date, commit, machine, torch, threads and load behind them."""
from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

FORMAT = "v41viz-results/1"
REQUIRED = ("format", "kind", "command", "date", "commit", "machine", "torch", "threads", "load_average", "wall_s",
            "rows")
ROOT = Path(__file__).resolve().parents[2]


class ResultsRecorder:
    """Started as a measurement starts (the load average and the clock), written when it ends with its rows.

    path None records nothing (the script's --results was not given); program is how a user starts the command
    ("scripts/bench_sampling.py", "-m engine bench"), argv its arguments (default: this process's). A
    computation that runs without torch (`engine plan`) passes uses_torch=False: the file then says "not used"
    where it would name torch's version, and writing it imports no torch."""

    def __init__(self, path: str | Path | None, kind: str, program: str, argv: list[str] | None = None,
                 uses_torch: bool = True):
        self.path = Path(path) if path else None
        self.kind = kind
        self.uses_torch = uses_torch
        args = sys.argv[1:] if argv is None else list(argv)
        self.command = " ".join(["python", *program.split(), *map(shlex.quote, args)])
        self.commit = commit_description() if self.path else ""   # the code that measures, as it starts
        self.load_before = os.getloadavg()
        self.t0 = time.perf_counter()

    def write(self, rows: list[dict], threads: int | None, settings: dict | None = None,
              tables: dict[str, list[dict]] | None = None, notes: list[str] | None = None) -> dict | None:
        """The results object (also written to the path, if any); rows and tables are lists of flat or nested dicts
        of strings and finite numbers."""
        if self.path is None:
            return None
        results = {"format": FORMAT, "kind": self.kind, "command": self.command,
                   "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "commit": self.commit, "machine": machine(),
                   "torch": torch_version() if self.uses_torch else "not used",
                   "threads": threads, "load_average": {"before": [round(x, 2) for x in self.load_before],
                                                        "after": [round(x, 2) for x in os.getloadavg()]},
                   "wall_s": round(time.perf_counter() - self.t0, 1), "settings": settings or {}, "rows": rows,
                   "tables": tables or {}, "notes": notes or []}
        problems = check(results)
        if problems:
            raise ValueError(f"malformed results for {self.path}: {'; '.join(problems)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"results written to {self.path}", file=sys.stderr)
        return results


def torch_version() -> str:
    # here, not at the top: scripts/render_results.py and `engine plan --results` run without torch
    import torch
    return torch.__version__


def machine() -> dict:
    """The CPU's model name and this machine's core count."""
    return {"cpu": cpu_model() or "unknown CPU", "cores": os.cpu_count()}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), or "" where that is not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def commit_description() -> str:
    """The checkout's short commit, with "+ uncommitted changes" where the tree differs from it."""
    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60)
        return run.stdout.strip() if run.returncode == 0 else ""
    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "engine", "scripts", "configs", "v41viz")
    return head + (" + uncommitted changes" if dirty else "")


def check(results: dict) -> list[str]:
    """What is wrong with a results object: missing keys, a wrong format, rows that are not dicts, numbers that are
    not finite (empty when it is well-formed)."""
    problems = [f"no '{key}'" for key in REQUIRED if key not in results]
    if results.get("format") != FORMAT:
        problems.append(f"format is {results.get('format')!r}, not {FORMAT!r}")
    tables = {"rows": results.get("rows"), **(results.get("tables") or {})}
    for name, rows in tables.items():
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            problems.append(f"'{name}' is not a non-empty list of objects")
    machine_ = results.get("machine")
    if not isinstance(machine_, dict) or not machine_.get("cpu") or not isinstance(machine_.get("cores"), int):
        problems.append("'machine' needs a cpu name and a core count")
    load = results.get("load_average")
    if not isinstance(load, dict) or set(load) != {"before", "after"}:
        problems.append("'load_average' needs 'before' and 'after'")
    problems += [f"{where} is not finite" for where in non_finite(results, "")]
    return problems


def non_finite(value, where: str) -> list[str]:
    """The paths of the NaN and infinite numbers inside value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "a value"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite(v, f"{where}[{i}]")]
    return []


def load(path: str | Path) -> dict:
    """A results file, read and checked."""
    results = json.loads(Path(path).read_text(encoding="utf-8"))
    problems = check(results)
    if problems:
        raise ValueError(f"malformed results file {path}: {'; '.join(problems)}")
    return results


def spread(values: list[float]) -> dict:
    """median, min and max of values (the form every timing cell of a results file takes)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
