"""Checks of command-line values made before any work, each refusal naming the flag, the value and the rule."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from ..request.sampling import MAX_SEED
from ..spec.errors import InputError

_DEVICE = re.compile(r"(cpu|cuda)(:(\d+))?")


def check_at_least(value: int, minimum: int, flag: str) -> int:
    if value < minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}")
    return value


def check_at_most(value: int, maximum: int, flag: str, why: str) -> int:
    """value <= maximum; why says where the maximum comes from."""
    if value > maximum:
        raise InputError(f"{flag} must be at most {maximum:,} ({why}), got {value:,}")
    return value


def check_fraction(value: float, flag: str) -> float:
    """A probability-like value in [0, 1] (NaN refused)."""
    if not 0.0 <= value <= 1.0:
        raise InputError(f"{flag} must lie in [0, 1], got {value}")
    return value


def check_finite(value: float, flag: str) -> float:
    if not math.isfinite(value):
        raise InputError(f"{flag} must be a finite number, got {value}")
    return value


def check_seed(seed: int, flag: str = "--seed") -> int:
    if not 0 <= seed <= MAX_SEED:
        raise InputError(f"{flag} must lie in 0..2**63-1 ({MAX_SEED}), got {seed}")
    return seed


def check_device(device: str, flag: str = "--device") -> str:
    """cpu, cuda or cuda:N with N an existing GPU (CUDA available)."""
    found = _DEVICE.fullmatch(device)
    if found is None:
        raise InputError(f"{flag} {device!r} is not a device this engine runs on: use cpu, cuda or cuda:N")
    if found.group(1) == "cpu":
        if found.group(2):
            raise InputError(f"{flag} {device!r}: the CPU takes no index; use cpu")
        return device
    # torch only for a command that names a device
    import torch
    if not torch.cuda.is_available():
        raise InputError(f"{flag} {device}: CUDA is not available on this machine")
    index, count = int(found.group(3) or 0), torch.cuda.device_count()
    if index >= count:
        raise InputError(f"{flag} {device}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return device


def check_output_file(path: str, flag: str) -> Path:
    """A file the command will write at the end: refused now when it is a directory or its folder is missing or
    not writable, so a long run does not end in a failed write."""
    out = Path(path)
    if out.is_dir():
        raise InputError(f"{flag} {path}: is a directory; give a file name")
    folder = out.parent
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: the folder {folder} does not exist" if not folder.exists() else
                         f"{flag} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InputError(f"{flag} {path}: not writable (check the permissions of {out if out.exists() else folder})")
    return out


def check_threads(threads: int | None, flag: str = "--threads") -> int | None:
    """None (torch's choice) or 1..the machine's CPU count."""
    if threads is None:
        return None
    check_at_least(threads, 1, flag)
    return check_at_most(threads, os.cpu_count() or 1, flag, "this machine's CPU count")
