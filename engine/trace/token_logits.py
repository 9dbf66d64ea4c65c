"""What a token record keeps of the logits it was drawn from: their top-k and the token's log-probability, at a
small share of a decode step even over a 129k vocabulary (torch is imported by the caller: only generation
passes logits)."""
from __future__ import annotations

import numpy as np
import torch

CHUNK = 128              # logits per chunk of top_k's first pass
CHUNKED_FROM = 16_384    # vocabularies from which top_k goes through the chunks (below, torch.topk is as fast)


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest of logits [V] (k ≤ V), values descending: torch.topk's, except which of
    equal values come first. Over a large vocabulary one vectorised pass takes each chunk's maximum and the top-k
    sorts the k chunks with the largest maxima only: every other chunk has k values at least as large as its
    best (the chosen chunks' maxima), so the k largest lie among the candidates (NaN, the largest to torch.topk,
    is its chunk's maximum as well). On a CPU torch.topk's own pass over V is the slower way."""
    v = logits.numel()
    n = v // CHUNK
    if v < CHUNKED_FROM or k > n:
        return tuple(torch.topk(logits, k))
    body = logits[: n * CHUNK].view(n, CHUNK)                                  # [n, CHUNK]
    chunks = torch.topk(body.amax(1), k).indices                               # [k] the chunks with the largest maxima
    offsets = torch.arange(CHUNK, device=logits.device)
    where = torch.cat([(chunks.unsqueeze(1) * CHUNK + offsets).view(-1),       # [k·CHUNK + the tail]
                       torch.arange(n * CHUNK, v, device=logits.device)])
    top = torch.topk(logits[where], k)
    return top.values, where[top.indices]


def predicted(logits: torch.Tensor, token_id: int, k: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """logits [V] (any float dtype, any device) → (the log-probability of token_id, NaN when it is not in the
    vocabulary; then top-k ids int64, logits fp32 and probabilities fp32 [min(k, V)]), from one log-softmax."""
    lf = logits.detach().float().reshape(-1)                                   # [V]
    log_probs = torch.log_softmax(lf, -1)
    logprob = float(log_probs[token_id]) if 0 <= token_id < lf.numel() else float("nan")
    values, ids = top_k(lf, min(k, lf.numel()))
    return (logprob, ids.cpu().numpy().astype(np.int64), values.cpu().numpy().astype(np.float32),
            log_probs[ids].exp().cpu().numpy().astype(np.float32))
