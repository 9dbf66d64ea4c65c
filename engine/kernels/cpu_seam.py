"""The CPU C++ kernel of an mHC seam's few-token mixes (cpu_seam.cpp), built (engine.kernels.cpu_extension) on the
first few-token seam a process runs on the CPU. Where the build fails the engine keeps the Python-float path, which
gives the same bits (engine.speedups.fast_mhc), and says why once."""
from __future__ import annotations

from pathlib import Path

from .cpu_extension import CpuKernel

KERNEL = CpuKernel("v41viz_cpu_seam", Path(__file__).with_suffix(".cpp"), "CPU mHC seam kernel",
                   "few-token seams run on Python floats (same results, slower)")
load, unavailable_reason = KERNEL.load, KERNEL.unavailable_reason
