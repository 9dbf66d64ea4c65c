"""HostEngramTable: an Engram table kept on the host in FP8 (+ E8M0 row scales); only the hashed rows travel."""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..spec.errors import InputError
from .formats import ENGRAM_BLOCK, dequantize_engram_rows, quantize_engram_rows


class RowSource(Protocol):
    """One host-resident tensor: its shape and dtype, and the rows asked for (the checkpoint's RowSource
    reads them from the shard file with positioned reads; TensorRows from memory)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids LongTensor [...] → the rows [..., cols] on the host."""
        ...


class TensorRows:
    """A RowSource over a tensor in host memory: a table quantized in this process, or a small checkpoint's."""

    def __init__(self, table: torch.Tensor):
        self.table = table

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.table.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


class HostEngramTable(nn.Module):
    """`layers.L.engram.embed` of a quantized model (spec §2.2): `weight` [rows, head_dim] float8_e4m3fn and
    `scale` [rows, head_dim/32] E8M0 stay on the host as two attached RowSources; a call gathers the distinct
    rows its ids hash to (each once), moves the codes and scales to the model's device, dequantizes them there
    and returns them in the model's dtype. The table is never materialized, on the host or the device.

    The module has no parameters: the non-persistent buffer `anchor` (empty) follows `model.to(...)` and
    says where and in what dtype the rows go. The state dict lists `weight` and `scale` with their official
    shapes and dtypes as meta tensors (no data: saving a host table from the state dict fails loudly)."""

    host_resident = True  # the official-format loader attaches RowSources instead of reading these tensors

    def __init__(self, n_rows: int, head_dim: int, dtype=None, device=None):
        super().__init__()
        self.n_rows, self.head_dim = n_rows, head_dim
        self.register_buffer("anchor", torch.empty(0, dtype=dtype, device=device), persistent=False)
        self.weight_source: RowSource | None = None
        self.scale_source: RowSource | None = None

    @classmethod
    def from_embedding(cls, embed: nn.Embedding, from_values: bool = True) -> HostEngramTable:
        """The table of a built Engram: with from_values (and values) quantized per row and attached from
        memory (TensorRows); otherwise left unattached for a loader."""
        w = embed.weight
        table = cls(w.size(0), w.size(1), dtype=w.dtype, device=w.device)
        if from_values and not w.is_meta:
            codes, scale = quantize_engram_rows(w.detach().float().cpu())
            table.attach(TensorRows(codes), TensorRows(scale))
        return table

    def official_shapes(self) -> dict[str, tuple[tuple[int, int], torch.dtype]]:
        return {"weight": ((self.n_rows, self.head_dim), torch.float8_e4m3fn),
                "scale": ((self.n_rows, -(-self.head_dim // ENGRAM_BLOCK)), torch.float8_e8m0fnu)}

    def attach(self, weight: RowSource, scale: RowSource) -> None:
        """Read rows from these sources from now on (checked against the official shapes and dtypes)."""
        for leaf, source in (("weight", weight), ("scale", scale)):
            shape, dtype = self.official_shapes()[leaf]
            if tuple(source.shape) != shape or source.dtype != dtype:
                raise InputError(f"Engram table {leaf}: expected {dtype} {list(shape)}, the row source has "
                                 f"{source.dtype} {list(source.shape)}")
        self.weight_source, self.scale_source = weight, scale

    @property
    def weight(self) -> torch.Tensor:
        """A data-less stand-in for the [rows, head_dim] FP8 table on the host (zero-strided, reads give 0):
        Engram.forward sends the row ids to `embed.weight.device`, and the host is where this table wants
        them. The rows themselves come from calling the module."""
        return torch.zeros((), dtype=torch.float8_e4m3fn).expand(self.n_rows, self.head_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] (any device; read on the host) → rows [..., head_dim] on the anchor's device and dtype."""
        if self.weight_source is None or self.scale_source is None:
            raise InputError("this Engram table is host-resident and has no rows attached: load an official "
                             "checkpoint (engine.checkpoint.official) or attach(weight=RowSource, scale=RowSource)")
        wanted, where = torch.unique(ids.reshape(-1).cpu(), return_inverse=True)   # ascending, each row once
        dev = self.anchor.device
        codes = self.weight_source.rows(wanted).to(dev)                        # [U, head_dim] fp8
        scales = self.scale_source.rows(wanted).to(dev)                        # [U, head_dim/32] e8m0
        rows = dequantize_engram_rows(codes, scales).to(self.anchor.dtype)    # [U, head_dim]
        return rows[where.to(dev)].view(*ids.shape, self.head_dim)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for leaf, (shape, dtype) in self.official_shapes().items():
            destination[prefix + leaf] = torch.empty(shape, dtype=dtype, device="meta")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """load_state_dict with whole tensors (small checkpoints): they become in-memory row sources."""
        found = {leaf: state_dict.get(prefix + leaf) for leaf in ("weight", "scale")}
        missing = [prefix + leaf for leaf, t in found.items() if t is None]
        if missing:
            if strict:
                missing_keys.extend(missing)
            return
        if any(t.is_meta for t in found.values()):
            raise InputError(f"{prefix}weight / scale have no data (a host-resident table's state dict lists meta "
                             "stand-ins): attach the table's row sources instead")
        self.attach(TensorRows(found["weight"].cpu()), TensorRows(found["scale"].cpu()))

    def extra_repr(self) -> str:
        source = type(self.weight_source).__name__ if self.weight_source is not None else "no rows attached"
        return f"{self.n_rows} rows × {self.head_dim}, fp8 on the host ({source})"
