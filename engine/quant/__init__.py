"""The official quantized formats and the modules that keep weights in them (FP8 blocks, MXFP4, Engram rows)."""
from .apply import quantize_model, resident_bytes, round_trip_weights
from .host_engram import HostEngramTable, RowSource, TensorRows

__all__ = ["HostEngramTable", "RowSource", "TensorRows", "quantize_model", "resident_bytes", "round_trip_weights"]
