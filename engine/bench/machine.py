"""The machine a measurement ran on, in words: the GPU's name, or the CPU's model and core count."""
from __future__ import annotations

import os
import platform

import torch


def machine_description(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model() or platform.machine() + ' CPU'}, {os.cpu_count()} cores"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), or "" where that is not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""
