"""CheckpointError: a checkpoint that does not fit the model, or is not a readable one."""
from __future__ import annotations

from ..spec.errors import InputError


class CheckpointError(InputError):
    """A checkpoint that does not fit the model or is not a readable safetensors file; the message names the
    tensor and the file."""
