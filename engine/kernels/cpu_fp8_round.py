"""The CPU C++ kernel of activations' FP8 quant-dequant (cpu_fp8_round.cpp), built (engine.kernels.cpu_extension) on
the first forward with FP8 activation rounding a process runs on the CPU. Where the build fails
engine.speedups.fast_quant keeps its torch ops (the same bits) and says why once."""
from __future__ import annotations

from pathlib import Path

from .cpu_extension import CpuKernel

KERNEL = CpuKernel("v41viz_cpu_fp8_round", Path(__file__).with_suffix(".cpp"), "CPU FP8 activation rounding kernel",
                   "FP8 activation rounding runs as torch ops (the same bits, slower)")
load, unavailable_reason = KERNEL.load, KERNEL.unavailable_reason
