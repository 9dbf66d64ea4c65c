"""IndexerLoss: training-only KL of the lightning indexer's scores against the main attention (DeepSeek-V3.2)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec.errors import InputError
from .norm import upcast


class IndexerLoss:
    """Collects, during one forward, KL(target || softmax(indexer scores)) for every layer whose indexer
    computes scores (own / reindex). Pass it as Transformer.forward(..., indexer_loss=collector).

    The indexer's top-k is a hard choice, so the LM loss gives its weights no gradient; this loss does.
    Target: each head's softmax of the main attention logits restricted to the query's visible compressed
    rows, averaged over heads (= summed, then renormalised), detached. Both sides see only the visible rows
    (the candidate filter is ignored: the indexer learns a full ranking). Queries with no visible row are
    skipped. The indexer's inputs are detached too, so this loss trains the indexer alone.
    """

    def __init__(self) -> None:
        self.per_layer: dict[int, torch.Tensor] = {}   # layer → mean KL over its queries (0-dim)

    def add(self, layer: int, q: torch.Tensor, compressed: torch.Tensor, scale: float, scores: torch.Tensor,
            visible: torch.Tensor) -> None:
        """q [B, S, H, D] main queries, compressed [B, W, D] rows as the main attention reads them,
        scores [B, S, W] indexer scores, visible [B, S] number of compressed rows each query may use."""
        width = compressed.size(1)
        if scores.size(-1) != width:
            raise InputError(f"IndexerLoss: layer {layer} scores cover {scores.size(-1)} compressed rows, the "
                             f"attention reads {width}")
        seen = torch.arange(width, device=scores.device) < visible.unsqueeze(-1)      # [B, S, W]
        live = visible > 0                                                             # [B, S]
        if width == 0 or not bool(live.any()):
            return
        with torch.no_grad():
            logits = torch.einsum("bshd,bwd->bshw", upcast(q), upcast(compressed)) * scale   # [B, S, H, W]
            logits = logits.masked_fill(~seen.unsqueeze(2), float("-inf"))
            target = torch.softmax(logits[live], -1).mean(1)                                # [N, W]
        pred = torch.log_softmax(upcast(scores).masked_fill(~seen, float("-inf"))[live], -1)  # [N, W]
        # rows a query cannot see have target 0 and log-prob −inf; zero the log-prob so 0·(−inf) is not NaN
        pred = pred.masked_fill(~seen[live], 0.0)
        kl = F.kl_div(pred, target, reduction="none").sum(-1)                              # [N]
        self.per_layer[layer] = kl.mean()

    def value(self) -> torch.Tensor:
        """Mean over indexer layers of the per-query mean KL (nats); 0 when no layer had a visible row."""
        if not self.per_layer:
            return torch.zeros(())
        return torch.stack(list(self.per_layer.values())).mean()
