"""Model tensors (any device, any float dtype) as owned CPU numpy copies: what the Trace stores."""
from __future__ import annotations

import numpy as np


def as_list(t) -> list:
    """A tensor or array (any device) as nested Python lists."""
    return t.tolist() if hasattr(t, "tolist") else list(t)


def as_numpy(t, dtype=np.float32) -> np.ndarray:
    """A tensor or array as a CPU numpy array of `dtype` (always a copy: the model may reuse its buffers)."""
    if hasattr(t, "detach"):
        t = t.detach()
        if t.device.type != "cpu" or (t.dtype.is_floating_point and t.dtype.itemsize < 4):  # bf16/fp16: fp32 is exact
            t = t.to(device="cpu", dtype=_torch_dtype(dtype))
        return t.numpy().astype(dtype, copy=True)
    return np.array(t, dtype=dtype)


def as_numpy_many(tensors: tuple, dtype=np.float32) -> list[np.ndarray]:
    """Several tensors as arrays of one dtype; from a GPU through a single host copy (one sync)."""
    devices = {getattr(t, "device", None) for t in tensors}
    if len(devices) != 1 or None in devices or next(iter(devices)).type == "cpu":
        return [as_numpy(t, dtype) for t in tensors]
    import torch  # only tensors on a GPU get here
    target = _torch_dtype(dtype)
    flat = torch.cat([t.detach().reshape(-1).to(target) for t in tensors]).cpu().numpy()  # cat makes a copy
    out, start = [], 0
    for t in tensors:
        out.append(flat[start:start + t.numel()].reshape(tuple(t.shape)))
        start += t.numel()
    return out


def _torch_dtype(dtype):
    import torch
    return {np.float32: torch.float32, bool: torch.bool, np.int64: torch.int64}[dtype]
