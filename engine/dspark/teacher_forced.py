"""The drafter over a known sequence (for training and evaluation): many anchors at once, Markov head teacher-forced."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.draft import DraftContext, draft_hidden, main_features
from ..model.norm import upcast
from ..spec.errors import InputError


@dataclass
class DraftOutputs:
    logits: torch.Tensor              # [N, γ, V] Markov-corrected draft logits L_k for positions anchor+1+k
    confidence_logits: torch.Tensor   # [N, γ] raw z_k
    targets: torch.Tensor             # [N, γ] the sequence's tokens at anchor+1+k (−1 past its end)


def draft_teacher_forced(model, tokens: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor) -> DraftOutputs:
    """tokens [T] one sequence; taps [T, n_taps·dim] the target's main_hidden for it (forward(...).taps);
    anchors [N] positions a ≥ 1. For each anchor the drafter sees the target features of positions < a (its
    window) and the block [tokens[a], noise, …] at positions a .. a+γ−1, exactly as during generation when
    tokens[a] is the anchor; the Markov head takes the sequence's own previous token (teacher forcing), which
    equals generation whenever the earlier drafts were right. Differentiable unless called under no_grad."""
    a = model.args
    gamma, window = a.dspark_block_size, a.window_size
    T = tokens.shape[0]
    anchors = torch.as_tensor(anchors, dtype=torch.long).cpu()
    if anchors.numel() == 0 or anchors.min() < 1 or anchors.max() >= T:
        raise InputError(f"anchors must lie in 1..{T - 1} (a position with features before it), got "
                         f"{anchors.tolist()[:8]}")
    if taps.shape[0] != T:
        raise InputError(f"taps has {taps.shape[0]} positions for a sequence of {T} tokens")
    dev = model.device
    N = anchors.numel()
    main_x = main_features(model, taps.unsqueeze(0).to(dev))                 # [1, T, dim]
    pos_all = torch.arange(T, device=dev).unsqueeze(0)                        # [1, T]
    # the whole sequence serves as every anchor's ring; each anchor reads only its window of earlier positions
    rings = {st.attn.layer: st.attn.ring_kv(main_x, pos_all, model.options.quant_sim).expand(N, T, -1)
             for st in model.mtp}
    k = anchors.unsqueeze(1) - window + torch.arange(window)                  # [N, window] positions a−W .. a−1
    ring_index = torch.where(k >= 0, k, -1).to(dev)
    positions = anchors.unsqueeze(1) + torch.arange(gamma)                    # [N, γ]
    ids = torch.full((N, gamma), a.dspark_noise_token_id, dtype=torch.long)
    ids[:, 0] = tokens.cpu()[anchors]
    ctx = DraftContext(rows=torch.zeros(N, dtype=torch.long), positions=positions.to(dev), rings=rings,
                       ring_index=ring_index, quant_sim=model.options.quant_sim)
    hidden = draft_hidden(model, ids.to(dev), ctx)                           # [N, γ, dim]
    last = model.mtp[-1]
    base = F.linear(upcast(last.norm(hidden)), upcast(model.head.weight))    # [N, γ, V]
    padded = torch.cat([tokens.cpu(), torch.full((gamma + 1,), -1, dtype=torch.long)])
    seq = padded[anchors.unsqueeze(1) + torch.arange(gamma + 1)]              # [N, γ+1] tokens a .. a+γ
    prev = seq[:, :gamma].clamp_min(0).to(dev)                                # [N, γ] token before each target
    e, bias = last.markov_head(prev)                                          # [N, γ, r], [N, γ, V]
    z = last.confidence_head(hidden, e)                                       # [N, γ]
    return DraftOutputs(base + bias, z, seq[:, 1:])
