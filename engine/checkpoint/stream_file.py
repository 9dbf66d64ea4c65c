"""A safetensors file written piece by piece: every tensor's name, dtype and shape is known before any value (the
inventory says them), so the header is written first and each tensor's bytes go to their offset as rows are made,
without the file's tensors ever being in memory together (safetensors.save_file needs them all at once)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..accounting.inventory import TensorSpec
from .errors import CheckpointError
from .official import TORCH_DTYPES

ALIGN = 8   # the header is padded with spaces so that the data starts 8-byte aligned, as safetensors writes it


class StreamedFile:
    """One shard: `specs` in order, contiguous; write(name, row, values) puts rows of a tensor in place."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str]) -> None:
        header: dict = {"__metadata__": metadata}
        self.where: dict[str, tuple[TensorSpec, int]] = {}
        offset = 0
        for spec in specs:
            header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape),
                                 "data_offsets": [offset, offset + spec.nbytes]}
            self.where[spec.name] = (spec, offset)
            offset += spec.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % ALIGN)
        self.start = 8 + len(text)
        self.size = self.start + offset
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, len(text).to_bytes(8, "little") + text, 0)
        os.ftruncate(self.fd, self.size)

    def write(self, name: str, first_row: int, rows: torch.Tensor) -> None:
        """rows: tensor `name`'s rows first_row.. (all of it for a 1-D tensor), in its stored dtype."""
        spec, offset = self.where[name]
        if rows.dtype != TORCH_DTYPES[spec.dtype] or tuple(rows.shape[1:]) != spec.shape[1:]:
            raise CheckpointError(f"'{name}' is stored as {spec.dtype} {list(spec.shape)}; got rows of "
                                  f"{rows.dtype} {list(rows.shape)}")
        row_bytes = spec.nbytes // spec.shape[0]
        if first_row + rows.shape[0] > spec.shape[0]:
            raise CheckpointError(f"'{name}' has {spec.shape[0]} rows; got rows {first_row}..{first_row + len(rows)}")
        data = memoryview(rows.contiguous().view(torch.uint8).reshape(-1).numpy())   # [rows·row_bytes] bytes
        at, done = self.start + offset + first_row * row_bytes, 0
        while done < len(data):   # pwrite may write less than asked (at most ~2 GiB at once on Linux)
            done += os.pwrite(self.fd, data[done:], at + done)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> StreamedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
