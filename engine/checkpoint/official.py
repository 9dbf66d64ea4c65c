"""Reading the official checkpoint format lazily: the shard index, every tensor checked against tensor_inventory
before anything is copied, shards read memory-mapped one at a time, host-resident tables as RowSources."""
from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..accounting.inventory import TensorSpec
from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError
from .errors import CheckpointError
from .finite import check_finite, check_scale_range
from .header import read_safetensors_header
from .index import read_weight_map
from .official_layout import CONFIG_NAME, INDEX_NAME, SINGLE_NAME, official_folder, weight_name
from .paths import existing
from .tensor_source import Source

# safetensors dtype code → torch dtype, for every code the official inventory uses
TORCH_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8,
                "BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}
FLOAT_TARGETS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
REOPEN_FLOOR = 16 << 20   # bytes read through one mapping before it is dropped, at least


@dataclass(frozen=True)
class Located:
    """Where one checked tensor lives."""
    spec: TensorSpec
    shard: Path


class ShardRows:
    """The RowSource (engine.quant.host_engram) of one host-resident tensor in a shard (an Engram table or its
    scales): each row asked for is read with a positioned read (os.pread) at its offset in the shard, so only
    those bytes pass through the page cache and nothing of the table enters the process's resident set. (A
    memory map would not do: Linux maps a touched file page's whole page-cache folio, up to 2 MiB, so random
    rows of a memory-mapped table fill the resident set with most of the table.)

    Every row read is checked for NaN codes (and, for a scale of a `weight_code` weight, for a value that overflows
    its block): a table of the released model holds 189 GiB, too much to scan at load, while the rows a step
    reads are a few KiB, so checking them costs next to nothing. A damaged row raises CheckpointError when first
    used, naming the table, the row and the shard."""

    def __init__(self, shard: Path, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                 weight_code: str | None = None):
        self.shard, self.name, self.shape, self.dtype = shard, name, tuple(shape), dtype
        self.weight_code = weight_code
        self.row_bytes = math.prod(self.shape[1:]) * torch.empty((), dtype=dtype).element_size()
        self._file = None
        self._start = 0

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids LongTensor [...] of row numbers → Tensor [..., cols] (CPU, this source's dtype)."""
        flat = ids.reshape(-1).cpu()                                           # [N]
        if flat.numel() == 0:
            return torch.empty(*ids.shape, *self.shape[1:], dtype=self.dtype)
        if int(flat.min()) < 0 or int(flat.max()) >= self.shape[0]:
            raise InputError(f"row ids {int(flat.min())}..{int(flat.max())} are outside '{self.name}' "
                             f"({self.shape[0]} rows, {self.shard.name})")
        unique, inverse = torch.unique(flat, return_inverse=True)              # each row read once, in file order
        rows = unique.tolist()
        got = self._read(rows)                                                 # [U, cols]
        check_finite(got, self.name, str(self.shard), row_ids=rows)
        if self.weight_code is not None:
            check_scale_range(got, self.name, self.weight_code, str(self.shard), row_ids=rows)
        return got[inverse].reshape(*ids.shape, *self.shape[1:])               # [..., cols]

    def _read(self, rows: list[int]) -> torch.Tensor:
        fd, start, size = self._open(), self._start, self.row_bytes
        data = bytearray(len(rows) * size)
        for k, row in enumerate(rows):
            data[k * size:(k + 1) * size] = os.pread(fd, size, start + row * size)
        return torch.frombuffer(data, dtype=torch.uint8).view(self.dtype).view(len(rows), *self.shape[1:])

    def _open(self) -> int:
        """The shard's file descriptor, opened on first use, and where this tensor's bytes start in it."""
        if self._file is None:
            header = read_safetensors_header(self.shard)
            entry = header.entries.get(self.name)
            if entry is None:
                raise CheckpointError(f"'{self.name}' is missing from shard {self.shard.name}")
            if entry.end - entry.begin != self.shape[0] * self.row_bytes:
                raise CheckpointError(f"'{self.name}' in shard {self.shard.name} holds {entry.end - entry.begin} "
                                      f"bytes, not {self.shape[0]} rows of {self.row_bytes}")
            file = open(self.shard, "rb", buffering=0)  # noqa: SIM115 (held for the source's lifetime)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead around a row
            self._file, self._start = file, header.data_start + entry.begin
        return self._file.fileno()

    def __getstate__(self) -> dict:  # copies and pickles reopen the file on first use
        return {**self.__dict__, "_file": None}

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"ShardRows({self.name!r} {list(self.shape)} {dtype} in {self.shard.name})"


class OfficialCheckpoint:
    """An official-format folder: config.json (flat or HF composite, with quantization_config), the shard index
    model.safetensors.index.json (or one model.safetensors), and the shards. Reads headers and tensors lazily."""

    def __init__(self, path: str | Path):
        folder = official_folder(existing(path))
        if folder is None:
            raise CheckpointError(f"{path}: not an official-format checkpoint (its {CONFIG_NAME} has no "
                                  "quantization_config)")
        self.folder = folder
        self._headers: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}  # first: one-file folders map through it
        self.weight_map = self._read_weight_map()                              # name → shard file name

    def config(self) -> ModelArgs:
        return load_config(self.folder / CONFIG_NAME)

    def _read_weight_map(self) -> dict[str, str]:
        index = self.folder / INDEX_NAME
        if index.is_file():
            return read_weight_map(index)
        single = self.folder / SINGLE_NAME
        if single.is_file():
            return {name: SINGLE_NAME for name in self._header(SINGLE_NAME)}
        raise CheckpointError(f"{self.folder}: neither {INDEX_NAME} nor {SINGLE_NAME} is there")

    def _header(self, shard: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name → (safetensors dtype code, shape) of one shard, from its header only (checked by header.py, cached)."""
        if shard not in self._headers:
            entries = read_safetensors_header(self.folder / shard).entries
            self._headers[shard] = {n: (e.code, e.shape) for n, e in entries.items()}
            if (self.folder / INDEX_NAME).is_file():
                self._check_against_index(shard)
        return self._headers[shard]

    def _check_against_index(self, shard: str) -> None:
        """Every tensor a shard's header holds is one the index maps to this shard: a tensor unlisted, or also
        stored in another shard, means the index and the shards disagree on what the checkpoint is (which copy
        is meant?), so it is refused, naming the tensors, rather than one copy read and the other ignored."""
        problems = []
        for name in self._headers[shard]:
            mapped = self.weight_map.get(name)
            if mapped is None:
                problems.append(f"shard {shard} holds '{name}', which {INDEX_NAME} does not list")
            elif mapped != shard and (self.folder / mapped).is_file():   # a missing shard: locate names it
                held = name in self._header(mapped)
                problems.append(f"'{name}' is stored in shard {shard} as well as in shard {mapped} (the index maps it "
                                f"to {mapped}); a tensor lives in one shard" if held else
                                f"'{name}' is stored in shard {shard}, but the index maps it to shard {mapped}")
            if len(problems) == 4:
                break
        if problems:
            raise CheckpointError(f"{self.folder}: the shards disagree with {INDEX_NAME}: " + "; ".join(problems))

    def locate(self, names: Iterable[str], inventory: dict[str, TensorSpec]) -> dict[str, Located]:
        """Check every named tensor against its inventory spec (dtype, shape; a scale against its weight) and
        return where each lives. CheckpointError listing every problem, each naming the tensor and the shard."""
        problems: list[str] = []
        found: dict[str, Located] = {}
        missing_shards: dict[str, list[str]] = {}
        for name in names:
            spec = inventory.get(name)
            if spec is None:
                problems.append(f"the model needs '{name}', which the official layout of this config does not have")
                continue
            shard = self.weight_map.get(name)
            if shard is None:
                mapped = f"{INDEX_NAME} maps it to no shard" if (self.folder / INDEX_NAME).is_file() else \
                    f"{SINGLE_NAME} does not hold it"
                problems.append(f"'{name}'{_role(spec)} is missing: {mapped}")
                continue
            if not (self.folder / shard).is_file():
                missing_shards.setdefault(shard, []).append(name)
                continue
            header = self._header(shard)
            if name not in header:
                problems.append(f"'{name}'{_role(spec)} is missing from shard {shard} (the index maps it there)")
                continue
            code, shape = header[name]
            if code != spec.dtype:
                problems.append(f"'{name}' in shard {shard} is stored as {code}; the official format stores it "
                                f"as {spec.dtype}")
            elif shape != spec.shape:
                problems.append(_shape_problem(name, spec, shape, shard, inventory))
            else:
                found[name] = Located(spec, self.folder / shard)
        for shard, held in missing_shards.items():
            problems.insert(0, f"shard {shard} is missing from {self.folder}; it holds {_names(held)}")
        if problems:
            more = f" (and {len(problems) - 12} more problems)" if len(problems) > 12 else ""
            raise CheckpointError(f"{self.folder} does not fit the model: " + "; ".join(problems[:12]) + more)
        return found

    def tensors(self, located: dict[str, Located], budget: int | None = None,
                parts: dict[str, Source] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for the located tensors, shard by shard. Each tensor is a zero-copy view of the
        memory-mapped shard, valid until the caller drops it; the mapping is dropped and reopened after every
        `budget` bytes (default: twice the largest tensor, at least 16 MiB) so that the pages already read do
        not pile up in the resident set. parts: name → the part of it to read instead (Source.read: a copy of
        only those rows or columns)."""
        budget = budget or max(REOPEN_FLOOR, 2 * max((loc.spec.nbytes for loc in located.values()), default=0))
        by_shard: dict[Path, list[str]] = {}
        for name, loc in located.items():
            by_shard.setdefault(loc.shard, []).append(name)
        for shard in sorted(by_shard):
            pending = iter(by_shard[shard])
            name = next(pending, None)
            while name is not None:
                with safe_open(str(shard), framework="pt") as f:
                    read = 0
                    while name is not None and read < budget:
                        yield name, f.get_tensor(name) if parts is None else parts[name].read(f)
                        read += located[name].spec.nbytes
                        name = next(pending, None)

    def row_source(self, loc: Located) -> ShardRows:
        """The rows of a located host-resident tensor; a scale's rows are also checked against its weight's format."""
        weight_code = self.stored_code(weight_name(loc.spec.name)) if loc.spec.is_scale else None
        return ShardRows(loc.shard, loc.spec.name, loc.spec.shape, TORCH_DTYPES[loc.spec.dtype], weight_code)

    def stored_code(self, name: str) -> str | None:
        """The safetensors dtype code `name` is stored with, or None if the index or its shard lacks it."""
        shard = self.weight_map.get(name)
        if shard is None or not (self.folder / shard).is_file():
            return None
        entry = self._header(shard).get(name)
        return entry[0] if entry is not None else None

    def metadata(self) -> dict[str, str]:
        """The first shard's safetensors metadata (the producer and format); {} when no shard is there."""
        shards = [self.folder / s for s in sorted(set(self.weight_map.values())) if (self.folder / s).is_file()]
        if not shards:
            return {}
        with safe_open(str(shards[0]), framework="pt") as f:
            return dict(f.metadata() or {})


def _role(spec: TensorSpec) -> str:
    return f" (the E8M0 scale of '{weight_name(spec.name)}')" if spec.is_scale else ""


def _shape_problem(name: str, spec: TensorSpec, shape: tuple[int, ...], shard: str,
                   inventory: dict[str, TensorSpec]) -> str:
    if spec.is_scale:
        weight = inventory[weight_name(name)]
        return (f"scale '{name}' in shard {shard} has shape {list(shape)}, but its weight '{weight.name}' "
                f"{list(weight.shape)} ({weight.dtype}) needs a scale of shape {list(spec.shape)}")
    return f"'{name}' in shard {shard} has shape {list(shape)}; the config needs {list(spec.shape)}"


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
