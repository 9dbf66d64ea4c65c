"""What a token record keeps of the logits it was drawn from: their top-k and the token's log-probability, for many
tokens at once (engine.trace.pending_logits batches them; torch is imported by the caller: only generation passes
logits)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

CHUNK = 128              # logits per chunk of top_k's first pass
CHUNKED_FROM = 16_384    # vocabularies from which top_k goes through the chunks (below, torch.topk is as fast)


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) [..., k] of the k largest of each row of logits [..., V] (k ≤ V), values descending:
    torch.topk's, except which of equal values come first. Over a large vocabulary one vectorised pass takes each
    chunk's maximum and the top-k sorts the k chunks with the largest maxima only: every other chunk has k values
    at least as large as its best (the chosen chunks' maxima), so the k largest lie among the candidates (NaN, the
    largest to torch.topk, is its chunk's maximum as well). On a CPU torch.topk's own pass over V is the slower
    way."""
    v = logits.size(-1)
    n = v // CHUNK
    if v < CHUNKED_FROM or k > n:
        return tuple(torch.topk(logits, k))
    lead = logits.shape[:-1]
    body = logits[..., : n * CHUNK].unflatten(-1, (n, CHUNK))                 # [..., n, CHUNK]
    chunks = torch.topk(body.amax(-1), k).indices                              # [..., k] chunks of the largest maxima
    candidates = body.gather(-2, chunks.unsqueeze(-1).expand(*lead, k, CHUNK))   # [..., k, CHUNK]
    top = torch.topk(candidates.flatten(-2), k)                                # [..., k] of their k·CHUNK logits
    values, ids = top.values, chunks.gather(-1, top.indices // CHUNK) * CHUNK + top.indices % CHUNK
    if v == n * CHUNK:
        return values, ids
    tail = torch.arange(n * CHUNK, v, device=logits.device).expand(*lead, v - n * CHUNK)   # the last v mod CHUNK ids
    top = torch.topk(torch.cat([values, logits[..., n * CHUNK:]], -1), k)
    return top.values, torch.cat([ids, tail], -1).gather(-1, top.indices)


def predicted_rows(logits: torch.Tensor, token_ids: Sequence[int] | np.ndarray, k: int) -> tuple[np.ndarray,
                   np.ndarray, np.ndarray, np.ndarray]:
    """logits [N, V] (any float dtype, any device) and the N tokens they predicted → (each token's log-probability
    [N] float64, NaN for an id outside the vocabulary; the top-k ids int64, logits fp32 and probabilities fp32
    [N, min(k, V)]), from one log-softmax over the rows."""
    lf = logits.detach().float()                                               # [N, V]
    vocab = lf.size(-1)
    log_probs = torch.log_softmax(lf, -1)
    ids = torch.as_tensor(np.asarray(token_ids, np.int64).reshape(-1), device=lf.device)    # [N]
    known = (ids >= 0) & (ids < vocab)
    chosen = log_probs.gather(-1, ids.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1)        # [N]
    logprob = torch.where(known, chosen, float("nan")).double()
    values, top_ids = top_k(lf, min(k, vocab))
    probs = log_probs.gather(-1, top_ids).exp()
    return (logprob.cpu().numpy(), top_ids.cpu().numpy().astype(np.int64), values.cpu().numpy().astype(np.float32),
            probs.cpu().numpy().astype(np.float32))


def set_predicted(records: list, logits: torch.Tensor, k: int) -> None:
    """Give each token record (engine.trace.records.TokenRecord) its log-probability and top-k under its row of
    logits [len(records), V] (predicted_rows)."""
    logprob, ids, values, probs = predicted_rows(logits, [r.token_id for r in records], k)
    for i, rec in enumerate(records):
        rec.logprob, rec.top_ids, rec.top_logits, rec.top_probs = float(logprob[i]), ids[i], values[i], probs[i]
