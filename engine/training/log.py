"""Training log: an append-only CSV (one row per logged step) and a tqdm progress bar on stderr."""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from ..spec.errors import InputError

COLUMNS = ("step", "tokens", "train_loss", "heldout_loss", "lr", "tokens_per_s", "step_s", "elapsed_s",
           "max_violation", "seq_balance_loss", "indexer_kl")


class CsvLog:
    """Rows keyed by `columns` (the backbone log's by default); on resume, rows after the resumed step are
    dropped so the log stays one run."""

    def __init__(self, path: str | Path, resume_step: int | None = None, columns: tuple[str, ...] = COLUMNS):
        self.path, self.columns = Path(path), columns
        kept = [r for r in read_log(self.path) if int(r["step"]) <= resume_step] \
            if resume_step is not None and self.path.is_file() else []
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, columns)
            w.writeheader()
            w.writerows(kept)

    def write(self, **row) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise InputError(f"CsvLog.write: unknown column(s) {sorted(unknown)}")
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, self.columns).writerow({k: cell(row.get(k)) for k in self.columns})


def read_log(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def cell(value) -> str:
    """A CSV cell: empty for None and NaN, 6 significant digits for floats."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def progress_bar(total: int, start: int = 0):
    """A tqdm bar over optimizer steps `start`..`total` on stderr; the loop puts loss, tokens/s and a note in
    its postfix. In a terminal it redraws in place; otherwise (output sent to a file) it writes one line per
    step, so a log stays readable line by line."""
    # tqdm is optional (the train extra): only a training loop draws a bar
    from tqdm import tqdm

    if sys.stderr.isatty():
        return tqdm(total=total, initial=start, desc="step", unit="step", file=sys.stderr, dynamic_ncols=True)
    # a bar format ending in a newline turns tqdm's in-place redraws into lines; leave=False keeps it from
    # repeating the last line on close
    return tqdm(total=total, initial=start, desc="step", unit="step", file=sys.stderr, mininterval=0, ascii=True,
                bar_format="{l_bar}{bar}{r_bar}\n", leave=False)
