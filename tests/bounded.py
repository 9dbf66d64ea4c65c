"""Run a command in a child process with a time limit and an address-space cap; report its exit code, output,
wall time and peak resident memory (the bad-input corpus tests use it for the memory-bomb and hang cases)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@dataclass
class Outcome:
    returncode: int  # negative: killed by that signal (for example by the time limit)
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mib: float  # the child's peak resident set size
    timed_out: bool


def run_bounded(argv: list[str], *, timeout_s: float = 60.0, memory_cap_mib: int | None = 3072,
                stdin: str | None = None, cwd: Path = ROOT, env: dict | None = None) -> Outcome:
    """Run argv; the child cannot map more than memory_cap_mib of address space (RLIMIT_AS, so an allocation
    beyond it fails in the child instead of swamping the machine) and is killed after timeout_s."""
    def cap() -> None:
        if memory_cap_mib is not None:
            limit = memory_cap_mib * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    child_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=child_env, preexec_fn=cap, stdout=out, stderr=err,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, text=True)
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        timed_out, status, usage = False, 0, None
        while usage is None:  # reap the child ourselves: os.wait4 gives this child's own peak RSS
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                usage = None
                if time.perf_counter() - start > timeout_s:
                    timed_out = True
                    proc.kill()
                    _, status, usage = os.wait4(proc.pid, 0)
                else:
                    time.sleep(0.02)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Outcome(proc.returncode, out.read(), err.read(), wall, usage.ru_maxrss / 1024, timed_out)


def run_engine(*args: str, **kw) -> Outcome:
    """`python -m engine <args>` under run_bounded."""
    return run_bounded([PYTHON, "-m", "engine", *args], **kw)


def run_python(code: str, **kw) -> Outcome:
    """`python -c <code>` under run_bounded (for engine-API cases that must not grow the test process)."""
    return run_bounded([PYTHON, "-c", code], **kw)
