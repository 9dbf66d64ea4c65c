"""compiled_body(): decode_body through torch.compile (inductor), made once per process and shared by decoders."""
from __future__ import annotations

import warnings
from functools import lru_cache

import torch

from .decode_body import decode_body


@lru_cache(maxsize=1)
def compiled_body():
    """decode_body compiled with static shapes (a static body's widths never depend on a value). Dynamo guards
    its compiled graphs on the shapes of what the body is called with, so one wrapper serves every decoder.
    The indexer's RoPE factors stay complex tensors (the reference's cis), for which inductor calls the eager
    kernels and says so once; that notice is silenced, as it is expected."""
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
    return torch.compile(decode_body, dynamic=False)
