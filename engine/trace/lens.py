"""The logit lens resolved: every recorded layer read-out through the model's head in batched matmuls, into top-k
(read-outs recorded before the rest of the model's read-out get it first, row by row)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

CHUNK_LOGITS = 2**24  # logits one head matmul makes at a time (64 MiB of fp32), whatever the vocabulary


def lens_values(hidden: np.ndarray, next_ids: np.ndarray, readout: Callable, k: int) -> tuple[np.ndarray, ...]:
    """hidden [N, dim]: normed read-outs (one per layer and token), next_ids [N]: the token that followed each
    one's position (-1: none recorded), readout: the model's head (hidden [n, dim] -> logits [n, V], fp32) →
    (top_ids [N, k], top_probs [N, k], next_rank [N], next_prob [N]). next_rank counts from 1 (1: the lens's top
    token; ties rank alike) and is -1, with next_prob NaN, where no next token is known. The logits of all
    layers and tokens come from a few large matmuls instead of one small one per layer and decode step."""
    # torch loads only when this runs, not with the trace package: a saved trace opens without it
    import torch
    n = len(hidden)
    top_ids, top_probs = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    next_rank, next_prob = np.full(n, -1, np.int64), np.full(n, np.nan, np.float32)
    if not n:
        return top_ids, top_probs, next_rank, next_prob
    with torch.no_grad():
        vocab = readout(torch.from_numpy(hidden[:1])).shape[-1]
        chunk = max(1, CHUNK_LOGITS // vocab)
        if k > vocab:
            top_ids, top_probs = top_ids[:, :vocab], top_probs[:, :vocab]
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            logits = readout(torch.from_numpy(hidden[start:stop])).float()          # [c, V]
            probs = torch.softmax(logits, -1)                                        # as the token records take them
            top = torch.topk(logits, min(k, vocab), -1)
            top_ids[start:stop] = top.indices.cpu().numpy()
            top_probs[start:stop] = probs.gather(-1, top.indices).cpu().numpy()
            nxt = torch.from_numpy(next_ids[start:stop]).to(logits.device)
            known = (nxt >= 0) & (nxt < vocab)
            chosen = nxt.clamp(0, vocab - 1).unsqueeze(-1)                          # [c, 1]
            rank = torch.gt(logits, logits.gather(-1, chosen)).sum(-1, dtype=torch.int64) + 1   # [c]
            next_rank[start:stop] = torch.where(known, rank, -1).cpu().numpy()
            prob = probs.gather(-1, chosen).squeeze(-1)
            next_prob[start:stop] = torch.where(known, prob, float("nan")).cpu().numpy()
    return top_ids, top_probs, next_rank, next_prob


def finished_rows(unfinished: np.ndarray, finish: Callable) -> np.ndarray:
    """unfinished [N, ...] (fp32): read-outs a one-token step recorded before the rest of the model's read-out (V4.1:
    the collapse [dim] before the final norm; V4: the streams [hc, dim]) → finish(row) for each row on its own,
    [N, dim]: the bits the step's own calls would have made (a norm of many rows may take another path,
    engine.speedups.fast_norm)."""
    # torch loads only when this runs, not with the trace package: a saved trace opens without it
    import torch
    if not len(unfinished):
        return unfinished
    with torch.no_grad():
        rows = torch.from_numpy(unfinished)
        return torch.cat([finish(rows[i:i + 1]) for i in range(len(rows))]).float().cpu().numpy()
