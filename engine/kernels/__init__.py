"""Fused Triton kernels for the engine's hot spots; imported lazily, applied by `apply.apply_kernels`."""
