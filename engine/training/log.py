"""Training log: an append-only CSV (one row per logged step) and a one-line progress bar on stderr."""
from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

COLUMNS = ("step", "tokens", "train_loss", "heldout_loss", "lr", "tokens_per_s", "step_s", "elapsed_s",
           "max_violation", "seq_balance_loss", "indexer_kl")


class CsvLog:
    """Rows keyed by COLUMNS; on resume, rows after the resumed step are dropped so the log stays one run."""

    def __init__(self, path: str | Path, resume_step: int | None = None):
        self.path = Path(path)
        if resume_step is None or not self.path.is_file():
            with open(self.path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(COLUMNS)
        else:
            rows = read_log(self.path)
            with open(self.path, "w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, COLUMNS)
                w.writeheader()
                w.writerows(r for r in rows if int(r["step"]) <= resume_step)

    def write(self, **row) -> None:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"CsvLog.write: unknown column(s) {sorted(unknown)}")
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, COLUMNS).writerow({k: _fmt(row.get(k)) for k in COLUMNS})


def read_log(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


class Progress:
    """`step 120/3000 [##----] loss 5.123 | 812 tok/s | eta 1:02:03` rewritten in place (plain lines if not a tty)."""

    def __init__(self, total: int, start: int = 0, stream=None, width: int = 24):
        self.total, self.start, self.width = total, start, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, tokens_per_s: float, extra: str = "") -> None:
        done = step - self.start
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        filled = int(self.width * step / max(self.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        line = (f"step {step}/{self.total} [{bar}] loss {loss:.3f} | {tokens_per_s:,.0f} tok/s | "
                f"eta {_clock(eta)}" + (f" | {extra}" if extra else ""))
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
