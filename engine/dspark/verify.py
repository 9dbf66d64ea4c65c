"""Lossless verification of a draft block by rejection sampling (spec §8.1)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.sampling import sample_index
from ..spec.errors import InputError

GREEDY_T = 1e-5  # below this temperature a distribution is the one-hot argmax


@dataclass(frozen=True)
class Verdict:
    accepted: int        # how many of the scheduled drafts were kept
    token: int           # the replacement (on rejection) or the bonus token (all accepted)
    bonus: bool          # True when every scheduled draft was accepted


def distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in fp32, or the one-hot argmax when T is (near) zero.  [..., V] -> [..., V]"""
    logits = logits.float()
    if temperature < GREEDY_T:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def verify(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
           generator: torch.Generator | None = None) -> Verdict:
    """Accept drafts x_1..x_l left to right with probability min(1, p(x)/q(x)).

    drafts [l] token ids; q [l, V] the draft distributions they were sampled from; p [l+1, V] the target's
    distributions at the same positions plus one more (for the bonus token). The emitted tokens are distributed
    exactly as if sampled from p one at a time (Leviathan et al.; Chen et al.).
    """
    n = drafts.shape[0]
    if q.shape[0] != n or p.shape[0] != n + 1 or q.shape[-1] != p.shape[-1]:
        raise InputError(f"verify: drafts [{n}] need q [{n}, V] and p [{n + 1}, V]; got q {list(q.shape)}, "
                         f"p {list(p.shape)}")
    if n:
        # One uniform draw per draft, taken up front so the random stream does not depend on the outcome.
        u = torch.rand(n, generator=generator, device=p.device)
        idx = torch.arange(n, device=p.device)
        p_x, q_x = p[idx, drafts], q[idx, drafts].clamp_min(1e-8)
        rejected = (u >= (p_x / q_x).clamp(max=1.0)).nonzero()
        if rejected.numel():
            i = int(rejected[0])
            residual = (p[i] - q[i]).clamp_min(0)  # the part of p that q under-proposes
            mass = residual.sum()
            residual = residual / mass if mass > 1e-8 else p[i]
            token = int(sample_index(residual, generator))
            return Verdict(accepted=i, token=token, bonus=False)
    token = int(sample_index(p[n], generator))
    return Verdict(accepted=n, token=token, bonus=True)


def verify_greedy(drafts: torch.Tensor, target_ids: torch.Tensor) -> Verdict:
    """Temperature 0: keep drafts while they equal the target's argmax; the next token is the target's argmax
    after the kept prefix (what `verify` does with one-hot p and q, without building them).
    drafts [l]; target_ids [l+1] the target's argmax at the same positions plus one more."""
    n = drafts.shape[0]
    if target_ids.shape[0] != n + 1:
        raise InputError(f"verify_greedy: drafts [{n}] need target_ids [{n + 1}], got {list(target_ids.shape)}")
    differ = (drafts.to(target_ids.device) != target_ids[:n]).nonzero()
    accepted = int(differ[0]) if differ.numel() else n
    return Verdict(accepted=accepted, token=int(target_ids[accepted]), bonus=accepted == n)
