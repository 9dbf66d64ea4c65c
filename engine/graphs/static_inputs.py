"""DecodeInputs: the static device buffers one decode bucket reads (tokens, positions, rows, Engram ids) and writes (logits)."""
from __future__ import annotations

import torch


class DecodeInputs:
    """Everything a decode step of `bucket` rows feeds the body, packed in one int64 device tensor so a
    step costs one host→device copy; the fields are views of it, at fixed addresses a graph can read:

    * tokens [bucket, 1], positions [bucket, 1], rows [bucket] (cache rows), compressed [bucket, 1]
      (Engram compressed ids, for the trace), engram_ids [bucket, 1, L, cols] (hashed table rows, or None);
    * logits [bucket, vocab] (fp32, float64 for a float64 model), written by the body.

    Rows past the live batch are padding: token 0 at position 0 in `scratch_row`, a cache row no sequence
    uses, so whatever they write lands there and never in another sequence's state.
    """

    def __init__(self, model, bucket: int, scratch_row: int):
        a, dev = model.args, model.device
        self.bucket, self.scratch_row = bucket, scratch_row
        self.n_hash_layers = len(a.engram_layer_ids) if model.ngram is not None else 0
        self.n_columns = a.engram_n_columns if model.ngram is not None else 0
        width = 4 + self.n_hash_layers * self.n_columns
        pin = dev.type == "cuda"
        self.host = torch.zeros(bucket, width, dtype=torch.long, pin_memory=pin)   # staging on the host
        self.packed = torch.zeros(bucket, width, dtype=torch.long, device=dev)      # [bucket, 4 + L·cols]
        self.tokens = self.packed[:, 0:1]
        self.positions = self.packed[:, 1:2]
        self.rows = self.packed[:, 2]
        self.compressed = self.packed[:, 3:4]
        self.engram_ids = self.packed[:, 4:].view(bucket, 1, self.n_hash_layers, self.n_columns) \
            if self.n_hash_layers else None                                              # [bucket, 1, L, cols]
        out_dtype = torch.float64 if model.dtype == torch.float64 else torch.float32
        self.logits = torch.zeros(bucket, a.vocab_size, dtype=out_dtype, device=dev)

    def fill(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, engram=None) -> None:
        """tokens [n, 1], positions [n], rows [n] (CPU int64), engram (row ids [n, 1, L, cols], compressed
        [n, 1]) or None; rows n.. become padding. One copy to the device."""
        n = tokens.size(0)
        if n > self.bucket:
            raise ValueError(f"a batch of {n} rows does not fit the {self.bucket}-row bucket")
        h = self.host
        h.zero_()
        h[:, 2] = self.scratch_row
        h[:n, 0] = tokens[:, 0]
        h[:n, 1] = positions
        h[:n, 2] = rows
        if self.n_hash_layers:
            if engram is None:
                raise ValueError("this model has Engram layers: the step needs its hashed rows")
            ids, comp = engram
            if tuple(ids.shape) != (n, 1, self.n_hash_layers, self.n_columns):
                raise ValueError(f"Engram row ids of shape {tuple(ids.shape)}; expected "
                                 f"{(n, 1, self.n_hash_layers, self.n_columns)}")
            h[:n, 3] = comp[:, 0]
            h[:n, 4:] = ids.reshape(n, -1)
        self.packed.copy_(h)
