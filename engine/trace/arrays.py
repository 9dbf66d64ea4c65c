"""Model tensors as host numpy arrays: CPU tensors as views, GPU tensors by one non-blocking pinned copy per record."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the trace loads without torch: a recorded tensor is the caller's
    import torch

    Array = torch.Tensor | np.ndarray   # what the recording methods take: a model tensor or a host array


def on_gpu(t: Array) -> bool:
    return getattr(getattr(t, "device", None), "type", "cpu") != "cpu"  # (a numpy array's device is the str "cpu")


def host_view(t: Array | Sequence) -> np.ndarray:
    """A CPU tensor, array or nested list as a numpy array, without a copy where possible: the caller copies it
    into its own storage at once (the model may reuse its buffers). bf16/fp16 become fp32, which holds them exactly."""
    try:
        return t.numpy()  # the common case, a CPU tensor of a numpy dtype that needs no grad: a view
    except AttributeError:  # an array or a list
        return np.asarray(t)
    except (RuntimeError, TypeError):  # it requires grad, numpy lacks its dtype (bf16), or it lives on a device
        t = t.detach()
        if t.dtype.is_floating_point and t.dtype.itemsize < 4:
            t = t.float()
        return t.cpu().numpy()


class StagedCopy:
    """GPU tensors converted to the given dtypes and copied to one pinned host buffer by one non-blocking copy;
    arrays() waits for that copy and views the buffer (so recording never waits for the GPU)."""

    def __init__(self, tensors: Sequence[Array], dtypes: Sequence[str]) -> None:
        import torch  # only GPU tensors get here
        to_torch = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}
        parts, offset = [], 0
        self.layout: list[tuple[np.dtype, tuple[int, ...], int, np.ndarray | None]] = []  # dtype, shape, byte offset
        for t, dtype in zip(tensors, dtypes):
            dtype = np.dtype(dtype)
            if not on_gpu(t):  # a host value beside them (a default vision mask): copied now
                self.layout.append((dtype, tuple(t.shape), 0, np.array(host_view(t), dtype)))
                continue
            part = t.detach().to(to_torch[dtype.name]).reshape(-1).view(torch.uint8)  # raw bytes, contiguous
            parts.append(part)
            self.layout.append((dtype, tuple(t.shape), offset, None))
            offset += part.numel()
        flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        cuda = flat.is_cuda  # (the byte layout works from the CPU too: the tests check it there)
        self.host = torch.empty(flat.numel(), dtype=torch.uint8, pin_memory=cuda)
        self.host.copy_(flat, non_blocking=cuda)
        self.done = None
        if cuda:
            self.done = torch.cuda.Event()
            self.done.record(torch.cuda.current_stream(flat.device))

    def arrays(self) -> list[np.ndarray]:
        """The tensors as arrays of their dtypes and shapes (views of the pinned buffer), once the copy is done."""
        if self.done is not None:
            self.done.synchronize()
        raw = self.host.numpy()
        return [value if value is not None else
                np.frombuffer(raw, dtype, int(np.prod(shape, dtype=np.int64)), offset).reshape(shape)
                for dtype, shape, offset, value in self.layout]
