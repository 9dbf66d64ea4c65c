"""Fused Triton kernels for the engine's hot spots and their launchers; swapped into a model by engine.speedups."""
