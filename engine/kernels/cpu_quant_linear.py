"""The CPU C++ kernel of a few rows times an FP8 or MXFP4 weight in its stored codes (cpu_quant_linear.cpp), built
(engine.kernels.cpu_extension) on the first decode step a process runs on the CPU over a quantized model. Where the
build fails engine.speedups.fast_quant_linear keeps the dequantize-then-multiply path (the same results up to float
rounding) and says why once."""
from __future__ import annotations

from pathlib import Path

from .cpu_extension import CpuKernel

KERNEL = CpuKernel("v41viz_cpu_quant_linear", Path(__file__).with_suffix(".cpp"), "CPU few-row FP8/FP4 linear kernel",
                   "few-row quantized linears dequantize the whole weight per call (same results up to float "
                   "rounding, slower)")
load, unavailable_reason = KERNEL.load, KERNEL.unavailable_reason
