"""The machine a measurement ran on, in words: the GPU's name, or the CPU's model and core count."""
from __future__ import annotations

import os
import platform

import torch

from .results_file import cpu_model  # torch-free, so results files can be written without torch


def machine_description(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model() or platform.machine() + ' CPU'}, {os.cpu_count()} cores"

