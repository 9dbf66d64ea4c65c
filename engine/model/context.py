"""ForwardContext: what one forward call shares across layers (positions, cache rows, published indices)."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from .cache import ModelCache
from .interventions import NONE, Interventions
from .options import EngineOptions

T = TypeVar("T")


@dataclass
class ForwardContext:
    cache: ModelCache
    rows: torch.Tensor              # [B] cache row of each batch row (CPU)
    start: torch.Tensor             # [B] absolute position of each row's first token (CPU)
    n_tokens: int                   # S, tokens per row in this call
    positions: torch.Tensor         # [B, S] absolute positions (on the model's device)
    options: EngineOptions
    image_mask: torch.Tensor | None = None   # [B, S] bool, image-span tokens
    trace: object | None = None
    tokens: torch.Tensor | None = None       # [B, S] the call's token ids on the model's device (V4 hash routing)
    # published during the call: index lists (compressed-row coordinates, −1 empty) per index
    # source layer, and the candidate source's position mask
    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    candidates: torch.Tensor | None = None
    memo: dict = field(default_factory=dict)   # per-call values every layer would otherwise recompute
    indexer_loss: object | None = None         # an IndexerLoss collector (training only; no effect on outputs)
    interventions: Interventions = NONE        # what-if changes (engine.request.interventions); NONE = the reference
    # width, groups_out, trace_rows and hands_lens_unread read the call's values on the host; a CUDA-graph body's
    # context (engine.graphs.static_context) overrides them with static shapes and no read-back

    def cached(self, key: Hashable, make: Callable[[], T]) -> T:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    @property
    def rows_dev(self) -> torch.Tensor:
        """rows on the model's device (made once per call)."""
        return self.cached("rows_dev", lambda: self.rows.to(self.positions.device))

    def visible(self, ratio: int) -> torch.Tensor:
        """[B, S] number of compressed rows each query may use: groups it has fully passed."""
        return (self.positions + 1) // ratio

    def width(self, ratio: int) -> int:
        """Compressed rows any query of this call can see (the widest row's (start + S) // ratio)."""
        return int(((self.start + self.n_tokens) // ratio).max())

    def groups_out(self, n_done: torch.Tensor, ratio: int) -> int:
        """How many groups a compressor of this ratio returns per row, n_done [B] being the groups each row
        completes in this call: the most any row completes."""
        return int(n_done.max())

    def hands_lens_unread(self) -> bool:
        """Whether a one-token call's logit lens may hand the trace its layers not yet read out, all at the end
        (engine.model.lens_reads.LensReads.batched): the Trace reads them out when it is read."""
        return True

    def tail(self, n: int) -> "ForwardContext":
        """The same call restricted to each row's last n tokens (bounded replay)."""
        skip = self.n_tokens - n
        mask = None if self.image_mask is None else self.image_mask[:, skip:]
        cand = None if self.candidates is None else self.candidates[:, skip:]
        tokens = None if self.tokens is None else self.tokens[:, skip:]
        return replace(self, start=self.start + skip, n_tokens=n, positions=self.positions[:, skip:], image_mask=mask,
                       topk={k: v[:, skip:] for k, v in self.topk.items()}, candidates=cand, memo={}, tokens=tokens)

    def trace_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [B], positions [B, S]) on the CPU, as the Trace receives them."""
        return self.rows, self.cached("positions_cpu", lambda: self.positions.cpu())
