"""draft_body: the DSpark draft forward (and the greedy Markov head) as a pure function of static buffers."""
from __future__ import annotations

import torch

from ..dspark.drafter import draft_block_ids, draft_forward, markov_drafts
from ..model.interventions import NONE
from ..request.sampling import SamplingParams
from ..spec.errors import InputError
from ..speedups import sync_free
from .static_context import StaticDraftContext

_GREEDY = SamplingParams()


class DraftInputs:
    """The static device buffers of one draft bucket, fields of one packed int64 tensor (one host→device copy):
    ids [bucket, γ] ([anchor, noise, …]), positions [bucket, γ], rows [bucket] (drafter-cache rows),
    ring_index [bucket, window] (ring slots each row may read, −1 = empty). The body writes hidden
    [bucket, γ, dim], base [bucket, γ, V] (fp32; float64 for a float64 model) and, when greedy, tokens
    [bucket, γ] and the raw confidence logits z [bucket, γ]. Padding rows (past the live batch) read
    `scratch_row`, a drafter-cache row no sequence uses, at positions 0.. with no ring slots."""

    def __init__(self, model, bucket: int, scratch_row: int, window: int):
        a, dev = model.args, model.device
        G = self.gamma = a.dspark_block_size
        self.bucket, self.scratch_row, self.window = bucket, scratch_row, window
        self.args = a
        pin = dev.type == "cuda"
        width = 2 * G + 1 + window
        self.host = torch.zeros(bucket, width, dtype=torch.long, pin_memory=pin)
        self.packed = torch.zeros(bucket, width, dtype=torch.long, device=dev)      # [bucket, 2γ + 1 + window]
        self.ids = self.packed[:, 0:G]
        self.positions = self.packed[:, G:2 * G]
        self.rows = self.packed[:, 2 * G]
        self.ring_index = self.packed[:, 2 * G + 1:]
        fp = torch.float64 if model.dtype == torch.float64 else torch.float32
        self.hidden = torch.zeros(bucket, G, a.dim, dtype=model.dtype, device=dev)
        self.base = torch.zeros(bucket, G, a.vocab_size, dtype=fp, device=dev)
        self.tokens = torch.zeros(bucket, G, dtype=torch.long, device=dev)
        self.z = torch.zeros(bucket, G, dtype=fp, device=dev)

    def fill(self, anchors: torch.Tensor, start: torch.Tensor, rows: torch.Tensor, ring_index: torch.Tensor) -> None:
        """anchors [n], start [n] (each anchor's position), rows [n], ring_index [n, window], all CPU int64."""
        n, G = rows.numel(), self.gamma
        if n > self.bucket:
            raise InputError(f"a batch of {n} rows does not fit the {self.bucket}-row bucket")
        if tuple(ring_index.shape) != (n, self.window):
            raise InputError(f"ring_index of shape {tuple(ring_index.shape)}; expected {(n, self.window)}")
        h = self.host
        h[:, 0:G] = draft_block_ids(self.args, torch.zeros(self.bucket, dtype=torch.long))  # padding: [0, noise, …]
        h[:, G:2 * G] = torch.arange(G)
        h[:, 2 * G] = self.scratch_row
        h[:, 2 * G + 1:] = -1
        h[:n, 0:G] = draft_block_ids(self.args, anchors)
        h[:n, G:2 * G] = start.view(-1, 1) + torch.arange(G)
        h[:n, 2 * G] = rows
        h[:n, 2 * G + 1:] = ring_index
        self.packed.copy_(h)


def draft_body(model, rings, inputs: DraftInputs, trace=None, greedy: bool = False) -> None:
    """Every draft stage over inputs' rows (ring rows gathered on the device from `rings`, which it only
    reads), writing hidden and base logits; greedy: also the Markov head's argmax drafts and the confidence
    logits (no host value decides anything there). No host sync, no value-dependent shape (the speed paths
    under engine.speedups.sync_free)."""
    dev_rows = inputs.rows
    ring_rows = {layer: ring.index_select(0, dev_rows) for layer, ring in rings.rings.items()}  # [bucket, slots, D]
    ctx = StaticDraftContext(rows=dev_rows, positions=inputs.positions, rings=ring_rows,
                             ring_index=inputs.ring_index, quant_sim=model.options.quant_sim, trace=trace,
                             interventions=NONE)  # named here: torch.compile cannot trace a dataclass default object
    with sync_free():
        hidden, base = draft_forward(model, inputs.ids, ctx)                 # [bucket, γ, dim], [bucket, γ, V]
    inputs.hidden.copy_(hidden)
    inputs.base.copy_(base)
    if greedy:
        tokens, _, z = markov_drafts(model.mtp[-1], base, hidden, inputs.ids[:, 0], _GREEDY, [])
        inputs.tokens.copy_(tokens)
        inputs.z.copy_(z)
