"""DecodeInputs: static device buffers a decode bucket reads (tokens, positions, rows, Engram ids), writes (logits)."""
from __future__ import annotations

import torch

from ..spec.errors import InputError


class DecodeInputs:
    """Everything a step of `bucket` rows × `n_tokens` tokens feeds the body, packed in one int64 device
    tensor so a step costs one host→device copy; the fields are views of it, at fixed addresses a graph reads:

    * tokens [bucket, S], positions [bucket, S], rows [bucket] (cache rows), compressed [bucket, S]
      (Engram compressed ids, for the trace), engram_ids [bucket, S, L, cols] (hashed table rows, or None);
    * logits, written by the body: [bucket, vocab] ("last") or [bucket, S, vocab] ("all"), fp32 (float64
      for a float64 model); taps [bucket, S, n_taps·dim] when asked for (the DSpark drafter's features).

    Rows past the live batch are padding: token 0 at positions 0.. in `scratch_row`, a cache row no sequence
    uses, so whatever they write lands there and never in another sequence's state.
    """

    def __init__(self, model, bucket: int, scratch_row: int, n_tokens: int = 1, logits: str = "last",
                 taps: bool = False):
        a, dev = model.args, model.device
        if logits not in ("last", "all"):
            raise InputError(f"logits must be 'last' or 'all', got {logits!r}")
        S = self.n_tokens = n_tokens
        self.bucket, self.scratch_row = bucket, scratch_row
        self.n_hash_layers = len(a.engram_layer_ids) if model.ngram is not None else 0
        self.n_columns = a.engram_n_columns if model.ngram is not None else 0
        width = 3 * S + 1 + S * self.n_hash_layers * self.n_columns
        pin = dev.type == "cuda"
        self.host = torch.zeros(bucket, width, dtype=torch.long, pin_memory=pin)   # staging on the host
        self.packed = torch.zeros(bucket, width, dtype=torch.long, device=dev)      # [bucket, 3S + 1 + S·L·cols]
        self.tokens = self.packed[:, 0:S]
        self.positions = self.packed[:, S:2 * S]
        self.rows = self.packed[:, 2 * S]
        self.compressed = self.packed[:, 2 * S + 1:3 * S + 1]
        self.engram_ids = self.packed[:, 3 * S + 1:].view(bucket, S, self.n_hash_layers, self.n_columns) \
            if self.n_hash_layers else None                                              # [bucket, S, L, cols]
        out_dtype = torch.float64 if model.dtype == torch.float64 else torch.float32
        shape = (bucket, a.vocab_size) if logits == "last" else (bucket, S, a.vocab_size)
        self.logits_mode = logits
        self.logits = torch.zeros(shape, dtype=out_dtype, device=dev)
        n_taps = len(a.dspark_target_layer_ids) if model.tapped else 0
        if taps and not n_taps:
            raise InputError("taps=True: this model has no DSpark target layers to tap")
        self.taps = torch.zeros(bucket, S, n_taps * a.dim, dtype=model.dtype, device=dev) if taps else None

    def fill(self, tokens: torch.Tensor, start: torch.Tensor, rows: torch.Tensor, engram=None) -> None:
        """tokens [n, S], start [n] (each row's first position), rows [n] (CPU int64), engram (row ids
        [n, S, L, cols], compressed [n, S]) or None; rows n.. become padding. One copy to the device."""
        n, S = tokens.shape
        if n > self.bucket:
            raise InputError(f"a batch of {n} rows does not fit the {self.bucket}-row bucket")
        if S != self.n_tokens:
            raise InputError(f"{S} tokens per row; these buffers take {self.n_tokens}")
        h = self.host
        h.zero_()
        h[:, S:2 * S] = torch.arange(S)                                      # padding rows: positions 0..S−1
        h[:, 2 * S] = self.scratch_row
        h[:n, 0:S] = tokens
        h[:n, S:2 * S] = start.view(-1, 1) + torch.arange(S)
        h[:n, 2 * S] = rows
        if self.n_hash_layers:
            if engram is None:
                raise InputError("this model has Engram layers: the step needs its hashed rows")
            ids, comp = engram
            if tuple(ids.shape) != (n, S, self.n_hash_layers, self.n_columns):
                raise InputError(f"Engram row ids of shape {tuple(ids.shape)}; expected "
                                 f"{(n, S, self.n_hash_layers, self.n_columns)}")
            h[:n, 2 * S + 1:3 * S + 1] = comp
            h[:n, 3 * S + 1:] = ids.reshape(n, -1)
        self.packed.copy_(h)
