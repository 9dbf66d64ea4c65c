"""Whether Triton can run here, and the input checks every launcher applies before a launch."""
from __future__ import annotations

import importlib.util
import os

import torch

from ..spec.errors import InputError

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class KernelInputError(InputError):
    """A tensor handed to a Triton launcher has the wrong shape, dtype, device or layout."""


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks for the CPU interpreter (read by triton.jit at import of a kernel)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def unavailable_reason(device: torch.device | str) -> str | None:
    """None when Triton kernels can run on `device`, else the reason in words."""
    if importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed (pip install -r requirements.txt)"
    dev = torch.device(device)
    if dev.type == "cuda":
        return None if torch.cuda.is_available() else "CUDA is not available on this machine"
    if dev.type == "cpu":
        return None if interpreting() else ("Triton kernels on CPU tensors need the interpreter: set "
                                            "TRITON_INTERPRET=1 before the kernels are first imported")
    return f"Triton kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {dev.type}"


def require(device: torch.device | str) -> None:
    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"Triton kernels unavailable: {reason}")


def compiled_for(kernel, device: torch.device):
    """The kernel, after checking that it was built for where it runs: on CPU tensors only the interpreter works,
    and triton.jit chose interpreter or compiler when the kernel module was first imported."""
    if device.type == "cpu" and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton kernels were imported before TRITON_INTERPRET=1 was set, so they cannot run on "
                           "CPU tensors in this process: set TRITON_INTERPRET=1 at start-up")
    return kernel


def check(t: torch.Tensor, name: str, *, shape: tuple | None = None, dtypes: tuple | None = None,
          device: torch.device | None = None) -> torch.Tensor:
    """Validate one launcher input and return it contiguous. `shape` entries of None match any size."""
    if not isinstance(t, torch.Tensor):
        raise KernelInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise KernelInputError(f"{name} has shape {list(t.shape)}; expected {want}")
    if dtypes is not None and t.dtype not in dtypes:
        raise KernelInputError(f"{name} has dtype {t.dtype}; expected one of {', '.join(map(str, dtypes))}")
    if device is not None and t.device != device:
        raise KernelInputError(f"{name} is on {t.device}; expected {device} (all inputs on one device)")
    if t.requires_grad and torch.is_grad_enabled():
        raise KernelInputError(f"{name} requires grad: the Triton kernels have no backward; run the "
                               "PyTorch reference path (no kernels) for training")
    return t.contiguous()


def pow2(n: int) -> int:
    """Smallest power of two ≥ n (Triton block shapes must be powers of two)."""
    return 1 << max(0, int(n) - 1).bit_length()


def block(n: int, cap: int, floor: int = 1) -> int:
    """A power-of-two block covering n, at most cap and at least floor."""
    return max(floor, min(pow2(n), cap))
