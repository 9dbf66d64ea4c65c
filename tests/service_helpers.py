"""Launching the engine service under torchrun for the service tests: start it, attach to it, find its ranks, and
read each rank's stderr."""
from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.serving import RemoteEngine
from engine.spec.errors import EngineError

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, port: int, tmp_path: Path, *argv: str, env: dict | None = None) -> subprocess.Popen:
    """`torchrun --nproc-per-node n -m engine.serving … --port port`: each rank's stderr in tmp_path/logs, the
    key file under tmp_path (XDG_RUNTIME_DIR, which the caller sets for its own client too)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "--log-dir",
           str(tmp_path / "logs"), "--redirects", "2", "-m", "engine.serving", *argv, "--port", str(port)]
    # V41VIZ_CPU_KERNELS=0: the ranks run the Python path, not waiting on a C++ build another process may hold
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "XDG_RUNTIME_DIR": str(tmp_path),
                "V41VIZ_CPU_KERNELS": "0", **(env or {})}
    full_env.pop("ENGINE_SERVICE_KEY", None)
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def attach(port: int, proc: subprocess.Popen, timeout_s: float = 240) -> RemoteEngine:
    """A RemoteEngine on the service once it listens (its key file written)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return RemoteEngine(f"127.0.0.1:{port}")
        except EngineError:
            time.sleep(0.5)
    raise AssertionError(f"no service on port {port}: {output(proc)}")


def output(proc: subprocess.Popen) -> str:
    """The launcher's output (the ranks' stdout and torchrun's summary), once it has ended."""
    if proc.poll() is None:
        return "(still running)"
    return proc.stdout.read()[-4000:]


def rank_pids(proc: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the launcher's rank processes (its children, each with RANK in its environment)."""
    out = {}
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            rank = next(int(v[5:]) for v in environ if v.startswith(b"RANK="))
            out[rank] = int(pid)
    return out


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def rank_errors(tmp_path: Path) -> dict[int, str]:
    """{rank: its stderr} from torchrun's log folder."""
    return {int(Path(p).parent.name): Path(p).read_text()
            for p in glob.glob(str(tmp_path / "logs" / "**" / "stderr.log"), recursive=True)}


def stop(proc: subprocess.Popen, pids: dict[int, int] | None = None) -> None:
    """End the launch if a test left it running (torchrun ends its ranks), the hard way if it does not stop; then
    any of its ranks (pids) still there."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in (pids or {}).values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
