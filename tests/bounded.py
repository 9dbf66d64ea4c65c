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
PEAK_FILE = "BOUNDED_PEAK_FILE"
# Runs `-m module ...` or `-c code ...` after registering an exit hook that writes the process's own VmHWM (peak
# resident KiB). The kernel's rusage figure cannot be used: a child forked from a big test process inherits the
# parent's high-water mark across exec.
REPORT_PEAK = f"""
import atexit, os, runpy, sys
def report():
    with open('/proc/self/status') as status, open(os.environ['{PEAK_FILE}'], 'w') as out:
        out.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(report)
mode, target, *rest = sys.argv[1:]
if mode == '-m':
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name='__main__', alter_sys=True)
else:
    sys.argv = ['-c', *rest]
    exec(compile(target, '<string>', 'exec'), {{'__name__': '__main__'}})
"""


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

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("w+", suffix=".peak") as peak:
        child_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", PEAK_FILE: peak.name,
                     **(env or {})}
        if argv[0] == PYTHON and argv[1] in ("-m", "-c"):  # the child writes its own peak at exit
            argv = [PYTHON, "-c", REPORT_PEAK, *argv[1:]]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=child_env, preexec_fn=cap, stdout=out, stderr=err,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, text=True)
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        timed_out, polled_kib = False, 0
        while proc.poll() is None:  # sample the high-water mark while it runs (the kill case has no exit report)
            polled_kib = max(polled_kib, _high_water_kib(proc.pid))
            if time.perf_counter() - start > timeout_s:
                timed_out = True
                proc.kill()
                proc.wait()
            else:
                time.sleep(0.02)
        wall = time.perf_counter() - start
        reported = peak.read().strip()
        peak_kib = max(polled_kib, int(reported) if reported.isdecimal() else 0)
        out.seek(0)
        err.seek(0)
        return Outcome(proc.returncode, out.read(), err.read(), wall, peak_kib / 1024, timed_out)


def run_engine(*args: str, **kw) -> Outcome:
    """`python -m engine <args>` under run_bounded."""
    return run_bounded([PYTHON, "-m", "engine", *args], **kw)


def run_python(code: str, **kw) -> Outcome:
    """`python -c <code>` under run_bounded (for engine-API cases that must not grow the test process)."""
    return run_bounded([PYTHON, "-c", code], **kw)


def _high_water_kib(pid: int) -> int:
    """VmHWM of a running process from /proc (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0
