"""DSpark drafter stages `mtp.{s}` (spec §7): parameters only here; the draft forward is a later issue."""
from __future__ import annotations

import torch
from torch import nn

from .block import Block
from .linear import Linear
from .norm import RMSNorm


class MarkovHead(nn.Module):
    def __init__(self, args, dtype=None, device=None):
        super().__init__()
        self.embed = nn.Embedding(args.vocab_size, args.dspark_markov_rank, dtype=dtype, device=device)   # W1
        self.head = Linear(args.dspark_markov_rank, args.vocab_size, dtype=dtype, device=device)          # W2 [V, r]


class ConfidenceHead(nn.Module):
    def __init__(self, args, dtype=None, device=None):
        super().__init__()
        self.proj = Linear(args.dim + args.dspark_markov_rank, 1, dtype=dtype, device=device)


class DraftStage(Block):
    """An ordinary block (ratio 0, drafter expert counts) plus stage 0's main_proj/main_norm and the
    last stage's norm, Markov head and confidence head."""

    def __init__(self, args, role, stage: int, dtype=None, device=None):
        super().__init__(args, role, dtype=dtype, device=device)
        kw = dict(dtype=dtype, device=device)
        if stage == 0:
            self.main_proj = Linear(args.dim * len(args.dspark_target_layer_ids), args.dim, quantized=True, **kw)
            self.main_norm = RMSNorm(args.dim, args.norm_eps, **kw)
        if stage == args.n_draft_stages - 1:
            self.norm = RMSNorm(args.dim, args.norm_eps, **kw)
            self.markov_head = MarkovHead(args, **kw)
            self.confidence_head = ConfidenceHead(args, **kw)
