"""CUDA-graph decode: a sync-free single-token decode body replayed per bucketed batch size (eager on CPU)."""
from .buckets import bucket_for
from .decode_body import decode_body
from .decoder import GraphedDecoder
from .safety import CaptureUnsafeError, check_capture_safe
from .static_inputs import DecodeInputs
from .trace_buffers import TraceBuffers

__all__ = ["CaptureUnsafeError", "DecodeInputs", "GraphedDecoder", "TraceBuffers", "bucket_for", "check_capture_safe",
           "decode_body"]
