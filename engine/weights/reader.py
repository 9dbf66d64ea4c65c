"""WeightReader: a checkpoint folder (the official layout, the full release or any subset of its shards, or this
project's own layout) opened for looking at its learned parameters. Headers are read at once; tensors only when a
view asks, each read counted, so that a page can say how many bytes of the checkpoint it has touched."""
from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..accounting.inventory import inventory_tuple
from ..checkpoint.errors import CheckpointError
from ..checkpoint.files import INDEX_NAME, WEIGHTS_NAME
from ..checkpoint.finite import check_finite
from ..checkpoint.header import ITEM_BYTES, read_safetensors_header
from ..checkpoint.index import read_weight_map
from ..checkpoint.official_layout import CONFIG_NAME, official_args, scale_block, scale_name
from ..checkpoint.paths import existing
from ..quant.formats import dequantize_fp4, dequantize_fp8
from ..spec.config import ModelArgs, load_config

# safetensors dtype code → torch dtype, for every code a checkpoint of this architecture stores
TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
                "F8_E8M0": torch.float8_e8m0fnu}


class WeightReader:
    """One checkpoint folder: config.json and model.safetensors.index.json (or one model.safetensors). Shards the
    index names but the folder lacks are fine (a partial download): their tensors are reported absent. A shard
    whose header is unreadable (truncated, corrupt) is reported by name and its tensors are absent too.

    bytes_read counts the bytes of every tensor (or slice of one) read so far: the stored bytes, scales included."""

    def __init__(self, path: str | Path):
        path = existing(path)
        self.folder = path if path.is_dir() else path.parent
        config = self.folder / CONFIG_NAME
        if not config.is_file():
            raise CheckpointError(f"{self.folder}: no {CONFIG_NAME}: a checkpoint folder holds its config beside "
                                  "the weights")
        self.args: ModelArgs = load_config(config)
        self.weight_map = self._weight_map()                      # name → shard file name
        self.missing_shards: list[str] = []                       # named by the index, not in the folder
        self.broken_shards: dict[str, str] = {}                   # shard → why its header is unreadable
        self.entries: dict[str, tuple[str, str, tuple[int, ...]]] = {}   # name → (shard, dtype code, shape)
        for shard in sorted(set(self.weight_map.values())):
            if not (self.folder / shard).is_file():
                self.missing_shards.append(shard)
                continue
            try:
                header = read_safetensors_header(self.folder / shard)
            except CheckpointError as e:
                self.broken_shards[shard] = str(e)
                continue
            for name, entry in header.entries.items():
                self.entries[name] = (shard, entry.code, entry.shape)
        self.bytes_read = 0
        self.reads = 0                                            # tensors (or slices) read
        self.read_names: set[str] = set()
        self._open: dict[str, object] = {}

    def _weight_map(self) -> dict[str, str]:
        index = self.folder / INDEX_NAME
        if index.is_file():
            return read_weight_map(index)
        single = self.folder / WEIGHTS_NAME
        if single.is_file():
            return dict.fromkeys(read_safetensors_header(single).entries, WEIGHTS_NAME)
        raise CheckpointError(f"{self.folder}: neither {INDEX_NAME} nor {WEIGHTS_NAME} is there: no weights to read")

    # ---- what is there -----------------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.entries

    def absence(self, name: str) -> str | None:
        """Why `name` cannot be read (None when it can): not in the index, its shard not downloaded, or unreadable."""
        if name in self.entries:
            return None
        shard = self.weight_map.get(name)
        if shard is None:
            return f"'{name}' is in no shard of {self.folder.name} (the index does not list it)"
        if shard in self.broken_shards:
            return self.broken_shards[shard]
        if shard in self.missing_shards:
            return f"shard {shard} is not in the folder (it holds '{name}')"
        return f"shard {shard} does not hold '{name}' although the index maps it there"

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][2]

    def nbytes(self, name: str) -> int:
        _, code, shape = self.entries[name]
        return math.prod(shape) * ITEM_BYTES[code]

    @cached_property
    def folder_bytes(self) -> int:
        """Bytes of tensor data in the shards that are here and readable."""
        return sum(self.nbytes(n) for n in self.entries)

    @cached_property
    def total_bytes(self) -> int:
        """The whole checkpoint's tensor bytes: the shards here from their headers, the absent ones from the
        config's inventory (the tensors the index maps to them)."""
        args = official_args(self.args) if self._quantized() else self.args
        specs = {s.name: s.nbytes for s in inventory_tuple(args, include_vision=True)}
        absent = sum(specs.get(n, 0) for n in self.weight_map if n not in self.entries)
        return self.folder_bytes + absent

    def _quantized(self) -> bool:
        return any(code in ("F8_E4M3", "I8") for _, code, _ in self.entries.values()) or not self.entries

    # ---- reading -----------------------------------------------------------------------------------------------
    def tensor(self, name: str) -> torch.Tensor:
        """The stored tensor (its stored dtype), checked for NaN / Inf; CheckpointError naming it and its shard if
        it holds one, or if it cannot be read (see absence)."""
        f, shard = self._file(name)
        try:
            t = f.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"{self.folder / shard}: cannot read tensor '{name}' ({e})") from None
        self._count(name, t)
        check_finite(t, name, str(self.folder / shard))
        return t

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a stored tensor (get_slice: only those bytes are read), checked for NaN / Inf."""
        f, shard = self._file(name)
        try:
            t = f.get_slice(name)[start:stop]
        except SafetensorError as e:
            raise CheckpointError(f"{self.folder / shard}: cannot read rows {start}..{stop} of '{name}' ({e})") \
                from None
        self._count(name, t)
        check_finite(t, f"{name}[{start}:{stop}]", str(self.folder / shard))
        return t

    def weight(self, name: str) -> torch.Tensor:
        """A weight as float32: FP8 and packed FP4 weights dequantized with their E8M0 scale (read too)."""
        t = self.tensor(name)
        if t.dtype == torch.float8_e4m3fn:
            return dequantize_fp8(t, self.tensor(scale_name(name)), scale_block(name, "F8_E4M3", self.args))
        if t.dtype == torch.int8 and self.has(scale_name(name)):
            return dequantize_fp4(t, self.tensor(scale_name(name)))
        return t.float()

    def weight_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a weight as float32, reading only the blocks of rows (and their scales) that hold
        them: a statistic over a large matrix goes through it a slice at a time."""
        code = self.entries[name][1] if name in self.entries else None
        if code == "F8_E4M3" or (code == "I8" and self.has(scale_name(name))):
            b0, b1 = scale_block(name, code, self.args)
            low, high = start - start % b0, min(-(-stop // b0) * b0, self.shape(name)[0])   # whole blocks of rows
            w, s = self.rows(name, low, high), self.rows(scale_name(name), low // b0, -(-high // b0))
            full = dequantize_fp8(w, s, (b0, b1)) if code == "F8_E4M3" else dequantize_fp4(w, s)
            return full[start - low: stop - low]
        return self.rows(name, start, stop).float()

    def _file(self, name: str):
        reason = self.absence(name)
        if reason is not None:
            raise CheckpointError(reason)
        shard = self.entries[name][0]
        if shard not in self._open:
            try:
                self._open[shard] = safe_open(str(self.folder / shard), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{self.folder / shard}: not a readable safetensors file ({e})") from None
        return self._open[shard], shard

    def _count(self, name: str, t: torch.Tensor) -> None:
        self.bytes_read += t.numel() * t.element_size()
        self.reads += 1
        self.read_names.add(name)

    def close(self) -> None:
        self._open.clear()


def layer_of(name: str, args: ModelArgs) -> int:
    """The layer a tensor belongs to: layers.i → i, mtp.s → n_layers + s (the draft stages follow the backbone),
    anything else (embed, head, norm) → -1."""
    head, _, rest = name.partition(".")
    number = rest.partition(".")[0]
    if head == "layers" and number.isdigit():
        return int(number)
    if head == "mtp" and number.isdigit():
        return args.n_layers + int(number)
    return -1


def module_path(layer: int, args: ModelArgs) -> str:
    """layers.i for a backbone layer, mtp.s for a draft stage."""
    return f"layers.{layer}" if layer < args.n_layers else f"mtp.{layer - args.n_layers}"
