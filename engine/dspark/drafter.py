"""One DSpark draft (spec §7): the block forward, then the Markov head sampled left to right, and confidences."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.draft import DraftContext, draft_hidden
from ..model.interventions import NONE
from ..model.sampling import apply_history_rules, draw, probabilities
from ..request.sampling import SamplingParams
from .drafter_cache import DrafterCache


@dataclass
class Draft:
    tokens: torch.Tensor        # [B, γ] x_1..x_γ, drafts for positions anchor+1 .. anchor+γ
    q: torch.Tensor | None      # [B, γ, V] the distributions they were drawn from (Markov-corrected);
                                # None when greedy (one-hot at each token)
    confidence_logits: torch.Tensor  # [B, γ] raw z_k; c_k = sigmoid(z_k / temperature_k)

    def confidence(self, temperature: torch.Tensor | None = None) -> torch.Tensor:
        """c_k = P(draft k survives | drafts < k survived) [B, γ]; an optional per-position temperature
        (the paper's Sequential Temperature Scaling, fitted per deployment) divides the logits first."""
        z = self.confidence_logits if temperature is None else self.confidence_logits / temperature
        return torch.sigmoid(z)

    def draft_probs(self) -> torch.Tensor:
        """q_k(x_k) [B, γ]: each draft's probability under its own distribution."""
        if self.q is None:
            return torch.ones(self.tokens.shape)
        return self.q.gather(-1, self.tokens.unsqueeze(-1).to(self.q.device)).squeeze(-1)


def draft(model, rings: DrafterCache, rows: torch.Tensor, anchors: torch.Tensor, params: SamplingParams,
          generators: list, trace=None, interventions=None, histories=None) -> Draft:
    """Draft γ tokens after each row's anchor. The anchor sits at position rings.pos[row]; the rings hold the
    target features of every earlier committed position. rows [B] cache rows, anchors [B] token ids.
    (engine.graphs.GraphedDrafter runs the same two halves, draft_forward from static buffers.) interventions: an
    engine.model.interventions.Interventions; the drafter applies its drop-stage ones. histories: each row's tokens
    up to its anchor, for params' history rules (markov_drafts)."""
    a = model.args
    gamma, dev = a.dspark_block_size, model.device
    rows = torch.as_tensor(rows, dtype=torch.long).cpu()
    ids = draft_block_ids(a, anchors)                                        # [B, γ]
    positions = rings.pos[rows].unsqueeze(1) + torch.arange(gamma)           # [B, γ]
    ring_rows, ring_index = rings.read(rows)
    ctx = DraftContext(rows=rows, positions=positions.to(dev), rings=ring_rows, ring_index=ring_index,
                       quant_sim=model.options.quant_sim, trace=trace, interventions=interventions or NONE)
    hidden, base = draft_forward(model, ids.to(dev), ctx)
    tokens, q, z = markov_drafts(model.mtp[-1], base, hidden, ids[:, 0].to(dev), params, generators, histories)
    return Draft(tokens.cpu(), q, z.float().cpu())


def draft_block_ids(args, anchors) -> torch.Tensor:
    """[B, γ] (CPU) the draft block's input ids: [anchor, noise, …, noise]."""
    anchors = torch.as_tensor(anchors, dtype=torch.long).cpu().flatten()
    ids = torch.full((anchors.numel(), args.dspark_block_size), args.dspark_noise_token_id, dtype=torch.long)
    ids[:, 0] = anchors
    return ids


def draft_forward(model, ids: torch.Tensor, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The block forward: ids [B, γ] → (Hd [B, γ, dim] pre-norm hidden, base logits U [B, γ, V] fp32, or
    float64 for a float64 model). Sync-free with a CUDA-graph body's context (engine.graphs.static_context),
    under engine.speedups.sync_free (what a CUDA graph captures)."""
    hidden = draft_hidden(model, ids, ctx)                                   # [B, γ, dim]
    return hidden, model.vocab_logits(model.mtp[-1].norm(hidden))           # [B, γ, V]


def markov_drafts(last, base: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor, params: SamplingParams,
                  generators: list, histories=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The Markov head left to right over base [B, γ, V] → (tokens [B, γ], q [B, γ, V] or None when greedy,
    raw confidence logits z [B, γ]), on the model's device. anchors [B] precede draft 1. Greedy runs no host
    read (it is captured with the forward); sampling draws with the per-row host-seeded generators.
    histories (per row: its tokens up to the anchor): with params' history rules (repetition penalty, no-repeat
    n-gram) each draft is proposed as the target will judge it, after the history and the drafts before it; the
    verifier stays exact either way, the rules only raise the acceptance."""
    prev = anchors
    tokens, qs, zs = [], [], []
    rules = histories is not None and params.uses_history
    for k in range(base.size(1)):
        # the Markov head makes draft k depend on the token actually drafted before it
        e, bias = last.markov_head(prev)                                     # [B, r], [B, V]
        logits = base[:, k] + bias                                           # [B, V]
        if rules:
            drafted = torch.stack(tokens, 1).tolist() if tokens else [[] for _ in histories]
            logits = apply_history_rules(logits, [list(h) + d for h, d in zip(histories, drafted)], params)
        if params.greedy:  # q is the one-hot argmax: keep the ids only
            x, q = logits.argmax(-1), None
        else:
            q = probabilities(logits, params)                                # [B, V]
            x = draw(q, generators)
        zs.append(last.confidence_head(hidden[:, k], e))
        tokens.append(x)
        qs.append(q)
        prev = x
    return torch.stack(tokens, 1), None if params.greedy else torch.stack(qs, 1), torch.stack(zs, 1)
