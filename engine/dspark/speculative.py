"""Speculative generation with DSpark: draft → schedule → verify in one target forward → commit or roll back."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..generate import EOS_ID, GenerationResult, OnToken, StepInfo, _elapsed, _row_seeds, check_prompts
from ..sampling import SamplingParams, draw, make_generators, probabilities
from ..trace_records import DSparkStep
from .drafter import draft
from .drafter_cache import DrafterCache
from .metrics import DSparkMetrics, summarize
from .schedule import ThroughputTable, schedule_all, schedule_threshold, schedule_throughput
from .verify import verify, verify_greedy

SCHEDULES = ("all", "threshold", "auto")


@dataclass(frozen=True)
class DSparkConfig:
    schedule: str = "all"              # all | threshold | auto (DSpark Alg. 1 with a profiled table)
    threshold: float = 0.5             # for "threshold": cut before the first draft with c_k below it
    sps: ThroughputTable | None = None  # for "auto": steps per second by batch tokens
    early_stop: bool = True            # for "auto": the paper's online form; False = global search

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"DSpark schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "auto" and self.sps is None:
            raise ValueError("DSpark schedule 'auto' needs a ThroughputTable (engine.dspark.profile.load_or_profile)")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"DSpark threshold must lie in [0, 1], got {self.threshold}")

    def lengths(self, confidence: torch.Tensor) -> list[int]:
        """Drafts to verify per request, from confidences [R, γ]."""
        if self.schedule == "all":
            return schedule_all(confidence)
        if self.schedule == "threshold":
            return schedule_threshold(confidence, self.threshold)
        return schedule_throughput(confidence, self.sps, early_stop=self.early_stop)


@dataclass
class SpeculativeResult(GenerationResult):
    steps: list[DSparkStep] = field(default_factory=list)
    target_forwards: int = 0           # decode-time target forwards (one per speculative step)

    @property
    def metrics(self) -> DSparkMetrics:
        return summarize(self.steps, self.target_forwards, self.decode_s)


Verifier = Callable[..., object]


@torch.inference_mode()
def generate_speculative(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                         temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                         seed: int | Sequence[int] | None = None, stop_tokens: Sequence[int] = (EOS_ID,),
                         dspark: DSparkConfig | None = None, on_token: OnToken | None = None, trace=None,
                         token_text: Callable[[int], str] | None = None,
                         verifier: Verifier = verify) -> SpeculativeResult:
    """Same contract as engine.generate.generate (row i samples with seed + i; tokens, finish reasons), with
    every decode step a DSpark step. Lossless: greedy output equals plain greedy output, and at T > 0 the
    emitted tokens follow the target's distribution. `verifier` exists so tests can break it on purpose."""
    args = model.args
    if not args.has_dspark or not len(model.mtp):
        raise ValueError(f"config '{args.name or args.model_type}' has no DSpark drafter: run without --dspark")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    cfg = dspark or DSparkConfig()
    params = SamplingParams(float(temperature), top_k, float(top_p))
    prompts = check_prompts(prompts, args.vocab_size, args.max_seq_len)
    n, gamma = len(prompts), args.dspark_block_size
    device = model.device
    gens = make_generators(_row_seeds(seed, n), device)
    stop = {int(t) for t in stop_tokens}
    text_of = token_text or (lambda t: "")
    # γ + 1 spare positions: a verify forward is padded to the batch's longest scheduled block
    cache = model.new_cache(n, min(args.max_seq_len, max(map(len, prompts)) + max_new_tokens) + gamma + 1)
    rings = DrafterCache(model, n, cache.margin)
    res = SpeculativeResult([[] for _ in prompts], [""] * n, [len(p) for p in prompts])

    def emit(row: int, pos: int, token: int, step: int, dt: float, logits: torch.Tensor, prob: float) -> bool:
        """Append one token; False when the row is finished (a stop token is not appended)."""
        if token in stop:
            res.finish_reasons[row] = "stop"
            return False
        res.tokens[row].append(token)
        if trace is not None:
            trace.record_token(row, pos, token, text_of(token), step=step, step_time_s=dt, logits=logits)
        if on_token is not None:
            on_token(row, token, StepInfo(step, pos, dt, prob))
        if len(res.tokens[row]) >= max_new_tokens:
            res.finish_reasons[row] = "length"
        elif pos + 1 >= args.max_seq_len:
            res.finish_reasons[row] = "max_seq_len"
        else:
            return True
        return False

    # Prefill: prompts of equal length together (no padding enters any computation); the taps fill the
    # drafter rings for every prompt position.
    active, anchors = [], {}
    by_len: dict[int, list[int]] = {}
    for row, ids in enumerate(prompts):
        by_len.setdefault(len(ids), []).append(row)
        if trace is not None:
            trace.record_prompt(row, ids, [text_of(t) for t in ids])
    for length, group in by_len.items():
        t0 = time.perf_counter()
        logits, taps = model(torch.tensor([prompts[r] for r in group], device=device), cache,
                             rows=torch.tensor(group), trace=trace, logits="last", return_taps=True)  # [G, V]
        rings.append(model, taps, group)                                     # taps [G, S, n_taps·dim]
        dt = _elapsed(t0, device)
        res.prefill_s += dt
        if max_new_tokens == 0:
            for r in group:
                res.finish_reasons[r] = "length"
            continue
        p = probabilities(logits, params)                                     # [G, V]
        chosen = p.argmax(-1) if params.greedy else draw(p, [gens[r] for r in group])
        for i, r in enumerate(group):
            token = int(chosen[i])
            if emit(r, length, token, 0, dt, logits[i], float(p[i, token])):
                active.append(r)
                anchors[r] = token
    active.sort()

    step = 0
    while active:
        step += 1
        t0 = time.perf_counter()
        rows = torch.tensor(active)
        anchor_pos = cache.pos[rows].clone()                                   # [A] each anchor's position
        d = draft(model, rings, rows, torch.tensor([anchors[r] for r in active]), params,
                  [gens[r] for r in active], trace)
        conf = d.confidence()                                                  # [A, γ]
        lengths = cfg.lengths(conf)
        for i, r in enumerate(active):  # never verify past the token budget or the model's last position
            room = min(max_new_tokens - len(res.tokens[r]), args.max_seq_len - 1 - int(anchor_pos[i])) - 1
            lengths[i] = max(0, min(lengths[i], room))
        width = max(lengths) + 1
        block = torch.cat([rows.new_tensor([[anchors[r]] for r in active]), d.tokens[:, :width - 1]], 1)  # [A, w]
        logits, taps = model(block.to(device), cache, rows=rows, trace=trace, logits="all", return_taps=True)
        rings.append(model, taps, rows)                                        # [A, w, V], [A, w, n_taps·dim]
        res.target_forwards += 1
        verdicts = []
        target_ids = logits.argmax(-1).cpu() if params.greedy else None        # [A, w]
        for i, r in enumerate(active):
            ell = lengths[i]
            if params.greedy:
                verdicts.append((None, verify_greedy(d.tokens[i, :ell], target_ids[i, :ell + 1])))
                continue
            p = probabilities(logits[i, :ell + 1], params)                     # [ℓ+1, V]
            verdicts.append((p, verifier(d.tokens[i, :ell].to(device), d.q[i, :ell], p, generator=gens[r])))
        keep = anchor_pos + 1 + torch.tensor([v.accepted for _, v in verdicts])  # committed: anchor + accepted
        cache.rollback(keep, rows)
        rings.rollback(keep, rows)
        dt = _elapsed(t0, device)
        res.decode_s += dt
        res.step_times.append(dt)
        still, q_drafts = [], d.draft_probs().float().cpu().numpy()      # [A, γ]
        survival = np.cumprod(conf.numpy(), axis=1)                            # [A, γ]
        for i, r in enumerate(active):
            p, v = verdicts[i]
            if trace is not None:
                trace.rollback(r, int(keep[i]))
            rec = DSparkStep(row=r, step=step, anchor_pos=int(anchor_pos[i]), anchor_token=anchors[r],
                             drafted=d.tokens[i].numpy(), draft_probs=q_drafts[i],
                             confidences=conf[i].numpy(), survival=survival[i],
                             verify_len=lengths[i], accepted=v.accepted, next_token=v.token,
                             next_kind="bonus" if v.bonus else "replacement", time_s=dt)
            res.steps.append(rec)
            if trace is not None:
                trace.record_dspark_step(rec)
            out = [int(t) for t in d.tokens[i, :v.accepted]] + [v.token]
            alive = True
            for k, tok in enumerate(out):  # target logits at position anchor+k chose the token at anchor+k+1
                prob = 1.0 if p is None else float(p[k, tok])
                alive = emit(r, int(anchor_pos[i]) + 1 + k, tok, step, dt, logits[i, k], prob)
                if not alive:
                    break
            if alive:
                anchors[r] = v.token
                still.append(r)
        active = still
    return res
