"""CUDA-graph decode: sync-free decode, DSpark verify and draft bodies replayed per batch bucket (eager on CPU)."""
from .buckets import bucket_for, cache_length_for
from .decode_body import decode_body
from .decoder import GraphedDecoder
from .draft_body import DraftInputs, draft_body
from .drafter import GraphedDrafter
from .safety import CaptureUnsafeError, check_capture_safe, check_draft_capture_safe
from .static_inputs import DecodeInputs
from .trace_buffers import TraceBuffers

__all__ = ["CaptureUnsafeError", "DecodeInputs", "DraftInputs", "GraphedDecoder", "GraphedDrafter", "TraceBuffers",
           "bucket_for", "cache_length_for", "check_capture_safe", "check_draft_capture_safe", "decode_body",
           "draft_body"]
