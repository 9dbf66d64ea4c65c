"""The run store: finished, stopped and interrupted Inspect runs kept on disk, so that a refresh, a closed tab, a
server restart or a shared link on the same server opens the run itself instead of running it again.

One folder per run under a user cache folder ($V41VIZ_RUN_STORE, else $XDG_CACHE_HOME/v41viz/runs, else
~/.cache/v41viz/runs), named by an id the store makes (16 random hex digits: a link names a run by it, never by a
path). A folder holds `run.json` (what the list shows; its modification time is the run's last use) and the trace in
the project's own format (engine.trace, never pickle): while the run generates, `partial.json`, the tokens so far,
rewritten as they come (throttled) to a temporary file and renamed over the last one, so that a crash keeps what was
generated; when it ends, `trace.parquet.zip`, the whole trace, after which the partial file goes. The store is
bounded in runs and bytes: after each save the least recently used runs are dropped until it fits."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.spec.errors import InputError
from engine.trace import TokenRecord, Trace, TraceBudget, TraceFormatError

ENV = "V41VIZ_RUN_STORE"
RUN_ID = re.compile(r"[0-9a-f]{16}", re.ASCII)
MAX_BYTES = 256 * 2**20   # 16 runs at the largest trace the app writes (a 16 MiB Parquet zip), ~100 typical ones
MAX_RUNS = 100
PARTIAL_EVERY_S = 0.5     # the partial trace is rewritten at most this often while a run generates
RECORD_MAX_BYTES = 64 * 1024
FINAL, PARTIAL, RECORD = "trace.parquet.zip", "partial.json", "run.json"
_writing: set[str] = set()   # ids of the runs this process is generating now (their partial file is not a crash's)
_lock = threading.Lock()


def default_root() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "v41viz" / "runs"


@dataclass(frozen=True)
class StoredRun:
    """One run as the store lists it."""
    run_id: str
    model: str
    prompt: str        # its first 200 characters
    status: str        # done | stopped | error | interrupted | running
    n_tokens: int
    bytes: int
    used: float        # when it was last saved or opened (seconds since the epoch)


class RunStore:
    def __init__(self, root: str | Path | None = None, max_bytes: int = MAX_BYTES, max_runs: int = MAX_RUNS):
        self.root = Path(root) if root is not None else default_root()
        self.max_bytes, self.max_runs = max_bytes, max_runs

    # ---- writing ---------------------------------------------------------------------------------
    def begin(self, trace: Trace, model: str) -> RunWriter:
        """A new run's folder and id; the writer saves its tokens as they come and the trace at the end."""
        run_id = secrets.token_hex(8)
        folder = self.root / run_id
        folder.mkdir(parents=True, exist_ok=False)
        with _lock:
            _writing.add(run_id)
        writer = RunWriter(self, run_id, trace, model)
        writer.tokens(force=True)
        return writer

    # ---- reading ---------------------------------------------------------------------------------
    def open(self, run_id: str) -> tuple[Trace, StoredRun]:
        """The stored run's trace (the whole one, or the tokens saved before it was interrupted) and its entry;
        marks it used. InputError naming the id when it is not a run id, not here, or unreadable."""
        folder = self._folder(run_id)
        entry = self._entry(folder)
        if entry is None:
            raise InputError(f"run {run_id} is not in the run store ({self.root}): it was never stored here, or "
                             "the store dropped it to stay within its size")
        path = folder / FINAL if (folder / FINAL).is_file() else folder / PARTIAL
        try:
            trace = Trace.load(path)
        except (TraceFormatError, OSError) as e:
            raise InputError(f"run {run_id} in the run store cannot be read: {e}") from None
        if path.name == PARTIAL and entry.status != "running":
            trace.meta["finish"] = "interrupted"
        _touch(folder / RECORD)
        return trace, entry

    def runs(self) -> list[StoredRun]:
        """Every stored run, most recently used first."""
        if not self.root.is_dir():
            return []
        found = [e for p in self.root.iterdir() if RUN_ID.fullmatch(p.name) and (e := self._entry(p)) is not None]
        return sorted(found, key=lambda e: e.used, reverse=True)

    def size_bytes(self) -> int:
        return sum(e.bytes for e in self.runs())

    def prune(self, keep: str = "") -> list[str]:
        """Drop the least recently used runs (never `keep`, never one this process is writing) until the store
        holds at most max_runs runs and max_bytes bytes; returns the ids dropped."""
        runs = self.runs()
        total, dropped = sum(e.bytes for e in runs), []
        for entry in reversed(runs):   # least recently used first
            if len(runs) - len(dropped) <= self.max_runs and total <= self.max_bytes:
                break
            with _lock:
                busy = entry.run_id in _writing
            if entry.run_id == keep or busy:
                continue
            shutil.rmtree(self.root / entry.run_id, ignore_errors=True)
            dropped.append(entry.run_id)
            total -= entry.bytes
        return dropped

    # ---- the folder ------------------------------------------------------------------------------
    def _folder(self, run_id: str) -> Path:
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise InputError(f"{str(run_id)[:40]!r} is not a run id (16 hexadecimal digits)")
        return self.root / run_id

    def _entry(self, folder: Path) -> StoredRun | None:
        record = folder / RECORD
        try:
            if record.stat().st_size > RECORD_MAX_BYTES:
                return None
            raw = json.loads(record.read_text(encoding="utf-8"))
            used = record.stat().st_mtime
            size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        status = str(raw.get("status", ""))
        with _lock:
            if status == "running" and folder.name not in _writing:
                status = "interrupted"   # its writer is gone: the server stopped or crashed while it generated
        return StoredRun(folder.name, str(raw.get("model", ""))[:200], str(raw.get("prompt", ""))[:200], status,
                         int(raw.get("n_tokens", 0)) if isinstance(raw.get("n_tokens"), int) else 0, size, used)


class RunWriter:
    """Saves one run as it generates: tokens() from the generation thread after each token (throttled), finish()
    once when it ends. Called from the thread that records the trace, so the trace is never read while it is
    written to."""

    def __init__(self, store: RunStore, run_id: str, trace: Trace, model: str):
        self.store, self.run_id, self.trace, self.model = store, run_id, trace, model
        self.folder = store.root / run_id
        self.last = 0.0

    def tokens(self, force: bool = False) -> None:
        """Rewrite the partial trace (the tokens recorded so far, without their logits) if the last write is
        older than PARTIAL_EVERY_S."""
        now = time.monotonic()
        if not force and now - self.last < PARTIAL_EVERY_S:
            return
        self.last = now
        partial = Trace(TraceBudget(max_tokens=self.trace.budget.max_tokens, top_k_logits=0),
                        meta=dict(self.trace.meta, finish="running"))
        records = [TokenRecord(r.row, r.pos, r.token_id, r.text, r.generated, r.step, r.step_time_s)
                   for r in self.trace.recorded_tokens()]
        partial.record_tokens(records)
        _atomic(self.folder / PARTIAL, lambda p: partial.save(p, "json"))
        self._record("running", sum(r.generated for r in records))

    def finish(self, status: str) -> None:
        """Save the whole trace (status: done | stopped | error), drop the partial one, then prune the store."""
        try:
            _atomic(self.folder / FINAL, lambda p: self.trace.save(p, "parquet"))
            (self.folder / PARTIAL).unlink(missing_ok=True)
            n = sum(t.generated for r in self.trace.rows() for t in self.trace.tokens(r))
            self._record(status, n)
        finally:
            with _lock:
                _writing.discard(self.run_id)
        self.store.prune(keep=self.run_id)

    def _record(self, status: str, n_tokens: int) -> None:
        body = {"run_id": self.run_id, "model": self.model, "prompt": str(self.trace.meta.get("prompt", ""))[:200],
                "status": status, "n_tokens": n_tokens}
        _atomic(self.folder / RECORD, lambda p: p.write_text(json.dumps(body), encoding="utf-8"))


def _atomic(path: Path, write) -> None:
    """write(tmp) then rename over `path`: a reader (or a crash) sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass
