"""return_large_frees(): large CPU tensors freed go back to the operating system, so a long prefill's peak RSS is
what its live tensors need, not that plus the allocator's holes.

PyTorch's CPU allocator takes its memory from the C library's malloc. glibc serves a request above its mmap threshold
with a fresh mapping, unmapped on free; below it, from a heap that can only shrink from its top. The threshold starts
at 128 KiB and, each time a mapped block is freed, rises to that block's size (up to 32 MiB). After the first few
large tensors of a prefill, then, every tensor up to 32 MiB (a query block's index scores, a chunk's activations) comes
from the heap, and the holes they leave behind count in the RSS until the process ends: a 16k-token prefill of
tiny-v4.1 peaked at 2-3× its live tensors (scripts/bench_long_prompt.py).

Setting the threshold once with mallopt(M_MMAP_THRESHOLD) turns that rise off. Requests of RETURN_ABOVE or more are
then always mapped and always given back; smaller ones stay on the heap (they are many and short-lived, and mapping
each would cost a system call). A decode step's tensors are below it, so decoding is unchanged; a prefill maps its
large ones afresh (the kernel zeroes the pages, a small cost beside the products that fill them).

Only on Linux with glibc; elsewhere, or where the user set MALLOC_MMAP_THRESHOLD_ themselves (glibc's own
environment variable, which wins), nothing is changed."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

M_MMAP_THRESHOLD = -3          # glibc's <malloc.h> parameter number
RETURN_ABOVE = 1 << 20         # bytes: tensors of 1 MiB and more are mapped, and unmapped when freed


@functools.cache
def return_large_frees() -> bool:
    """Set glibc's mmap threshold to RETURN_ABOVE for this process (once); True if it was set."""
    if platform.system() != "Linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt(M_MMAP_THRESHOLD, RETURN_ABOVE) == 1     # mallopt returns 1 on success
    except (OSError, AttributeError):
        return False
