"""engine.speedups.host_memory: after return_large_frees(), a large tensor freed below a live small one gives its
pages back; glibc's default (its rising mmap threshold) keeps them. Each case runs in a fresh interpreter, whose
malloc state is its own."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.speedups import host_memory

# Allocate and free 8 MiB (glibc's default threshold rises to it), then 6 MiB with a small tensor made after it, and
# free the 6 MiB: printed, how many KiB of RSS that free gave back.
PROBE = """
import sys, torch
sys.path.insert(0, {root!r})
from engine.speedups.host_memory import return_large_frees
from engine.plan.memory_fit import process_memory
if {set_it}:
    assert return_large_frees()
first = torch.ones(2 << 20); del first
big = torch.ones(3 << 19)                      # 6 MiB, every page touched
small = torch.ones(1024)                       # lies above it on the heap when the heap served it
before = process_memory("VmRSS")
del big
print((before - process_memory("VmRSS")) // 1024)
"""

linux_glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                 reason="mallopt's mmap threshold is glibc's (Linux)")


def returned_kib(set_it: bool) -> int:
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run = subprocess.run([sys.executable, "-c", PROBE.format(root=root, set_it=set_it)], capture_output=True,
                         text=True, check=True, env=env, timeout=120)
    return int(run.stdout.split()[-1])


@pytest.mark.slow  # two fresh interpreters that import torch [10 s]
@linux_glibc
def test_freed_large_tensor_goes_back_only_with_the_threshold_set():
    assert returned_kib(True) >= 5 * 1024          # the 6 MiB were a mapping of their own, unmapped on free
    assert returned_kib(False) < 1024              # glibc's default: served from the heap, kept


def test_user_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    host_memory.return_large_frees.cache_clear()
    try:
        assert host_memory.return_large_frees() is False
    finally:
        host_memory.return_large_frees.cache_clear()
