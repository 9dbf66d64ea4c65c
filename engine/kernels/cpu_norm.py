"""The CPU C++ kernel of a few-row RMSNorm (cpu_norm.cpp), built (engine.kernels.cpu_extension) on the first decode
step a process runs on the CPU. Where the build fails engine.speedups.fast_norm keeps its torch ops (the same results
up to float rounding) and says why once."""
from __future__ import annotations

from pathlib import Path

from .cpu_extension import CpuKernel

KERNEL = CpuKernel("v41viz_cpu_norm", Path(__file__).with_suffix(".cpp"), "CPU few-row RMSNorm kernel",
                   "few-row norms run as torch ops (same results up to float rounding, slower)")
load, unavailable_reason = KERNEL.load, KERNEL.unavailable_reason
