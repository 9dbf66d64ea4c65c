"""Speculative generation with DSpark: draft → schedule → verify in one target forward → commit or roll back."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..dspark.config import DSparkConfig
from ..dspark.drafter import Draft, draft
from ..dspark.drafter_cache import DrafterCache
from ..dspark.metrics import DSparkMetrics, summarize
from ..dspark.verify import Verdict, verify, verify_greedy
from ..graphs import GraphedDecoder, GraphedDrafter, cache_length_for
from ..graphs.compiled_body import compiled_ring_rows
from ..model.interventions import Interventions
from ..model.sampling import (
    NonFiniteLogitsError,
    apply_history_rules,
    check_finite_logits,
    draw,
    make_generators,
    probabilities,
)
from ..model.transformer import Transformer
from ..request import GenerationRequest
from ..spec.errors import InputError
from ..trace import DSparkStep
from .results import Emitter, GenerationResult, OnToken, check_prompts, elapsed, row_seeds, run_interventions

__all__ = ["SpeculativeResult", "generate_speculative"]


@dataclass
class SpeculativeResult(GenerationResult):
    steps: list[DSparkStep] = field(default_factory=list)
    target_forwards: int = 0           # decode-time target forwards (one per speculative step, all rows)
    graphed_forwards: int = 0          # of those, verify forwards run by a GraphedDecoder (cuda_graphs, compiled)
    graphed_drafts: int = 0            # draft steps run by the GraphedDrafter (cuda_graphs, compiled: every step)
    plain_steps: int = 0               # decode steps without a draft (the auto schedule's fallback): not in
    plain_s: float = 0.0               # steps nor target_forwards; their seconds are in decode_s and here
    graphed_plain_steps: int = 0       # of the plain steps, those run by a one-token GraphedDecoder

    @property
    def metrics(self) -> DSparkMetrics:
        """The DSpark steps' aggregates (plain steps left out)."""
        return summarize(self.steps, self.target_forwards, self.decode_s - self.plain_s)


Verifier = Callable[..., object]


@torch.inference_mode()
def generate_speculative(model: Transformer, prompts: Sequence[Sequence[int]], request: GenerationRequest, *,
                         on_token: OnToken | None = None, token_text: Callable[[int], str] | None = None,
                         verifier: Verifier = verify) -> SpeculativeResult:
    """Same contract as engine.generation.plain.generate (row i samples with seed + i; tokens, finish reasons), with
    every decode step a DSpark step. Lossless: greedy output equals plain greedy output, and at T > 0 the
    emitted tokens follow the target's distribution. `verifier` exists so tests can break it on purpose.
    With the auto schedule and a profiled table, a step may be a plain step instead (no draft, one token per
    row) while the drafter's confidence says drafting does not pay (engine.dspark.fallback.PlainFallback).

    request.cuda_graphs: each step's target verify forward goes through an engine.graphs.GraphedDecoder (a CUDA
    graph per batch bucket on a GPU; on the CPU the same static body runs eagerly). A graph has a fixed
    width, so every row then verifies a full block [anchor, x_1..x_γ]; the schedule's ℓ still decides what
    is checked and accepted (logits past ℓ go unused), so tokens, accepted counts and random draws are
    those of the eager path. A step where some row lacks room for a full block in the cache runs eagerly.
    The draft step goes through an engine.graphs.GraphedDrafter: the stages' forward and base logits (and,
    greedy, the Markov argmax and confidences) from static buffers; sampled drafts are drawn on the host
    generators as in the eager drafter, so drafts, q and confidences are the eager ones. Prefill is eager.
    A graphed block costs the same whatever ℓ, so the auto schedule then verifies every draft, or none when the
    drafts' calibrated confidences say the block would not beat a plain forward (engine.dspark.schedule.schedule_block:
    the anchors alone then go through a one-token GraphedDecoder on the same cache, as its plain steps do).

    request.compiled: the same static verify, plain-step and draft bodies through torch.compile
    (engine.graphs.compiled_body; on a CPU, generated C++ instead of thousands of small ops a step; minutes of
    compiling on first use, cached on disk), with cuda_graphs' block widths and schedules; logits and drafts equal
    the eager bodies' up to float rounding, so greedy output equals compiled plain decoding's except where two
    logits tie within that rounding.

    request.interventions (engine.request.interventions) apply to every target forward, so the drafter's taps come
    from the intervened target, and drop-stage to the drafter: the output is the plain output under the same
    backbone interventions (greedy: token for token). Not with cuda_graphs or compiled.

    The sampling's repetition_penalty / no_repeat_ngram (engine.model.sampling.apply_history_rules) process the
    target's logits at every verified position with the history that position has if the drafts before it are
    accepted (prompt, committed tokens, those drafts), so verification compares the drafts with exactly what plain
    decoding under the same options would choose or sample there. The drafter applies them too, draft by draft
    (for acceptance only; with cuda_graphs its drafts then come from the eager drafter)."""
    args = model.args
    if not args.has_dspark or not len(model.mtp):
        raise InputError(f"config '{args.name or args.model_type}' has no DSpark drafter: run without --dspark")
    params = request.sampling
    cfg = request.dspark or DSparkConfig()
    if cfg.schedule == "auto" and not cfg.early_stop and not params.greedy:
        # the global search may look at a draft's own survival (which depends on the draft's value) before
        # deciding to verify it; the early-stopped form decides from earlier drafts only, which is lossless
        raise InputError("DSpark: the global-search scheduler (early_stop=False) is not lossless at temperature > 0; "
                         "use early_stop=True or greedy decoding")
    interventions = run_interventions(model, request.interventions, request.trace, graphed=request.graphed)
    run = _Speculation(model, check_prompts(prompts, args.vocab_size, args.max_seq_len), request, cfg, on_token,
                       token_text, verifier, interventions)
    run.prefill()
    while run.active:
        run.step()
    return run.res


class _Speculation:
    """One generate_speculative call: per-row state (anchor, caches, generator) and the step loop."""
    FORWARD_WEIGHT = 0.3   # the newest graphed forward's weight in the running mean of its width's seconds

    def __init__(self, model: Transformer, prompts: list[list[int]], request: GenerationRequest, cfg: DSparkConfig,
                 on_token: OnToken | None, token_text: Callable[[int], str] | None, verifier: Verifier,
                 interventions: Interventions) -> None:
        self.model, self.args, self.prompts, self.max_new = model, model.args, prompts, request.max_new_tokens
        self.interventions = interventions
        self.params, self.cfg, self.trace, self.verifier = request.sampling, cfg, request.trace, verifier
        self.prefill_chunk = request.prefill_chunk
        n, self.gamma = len(prompts), model.args.dspark_block_size
        self.temperature = cfg.temperature(self.gamma)
        self.gens = make_generators(row_seeds(self.params.seed, n), model.device)
        # γ + 1 spare positions: a verify forward is padded to the batch's longest scheduled block
        longest = min(self.args.max_seq_len, max(map(len, prompts)) + self.max_new)
        graphed, compiled = request.graphed, request.compiled
        # with graphs, one extra cache row takes a batch bucket's padding rows; the γ + 1 spare positions
        # already give every active row room for a full graphed block (the eager fallback guards the rest)
        length = longest + self.gamma + 1
        if compiled:  # a bucketed length: later runs of nearby lengths reuse the compiled graphs
            length = cache_length_for(length, self.args.max_seq_len + self.gamma + 1)
        self.cache = model.new_cache(n + 1 if graphed else n, length)
        self.fallback = cfg.fallback()                         # auto: plain steps while drafting does not pay
        # graphed target forwards by block width: γ + 1 (verify), 1 (the fallback's plain steps)
        self.decoders: dict[int, GraphedDecoder] = {}
        self.forward_s: dict[int, float] = {}   # their seconds by width (running means, weight FORWARD_WEIGHT)
        if graphed:
            for width in (self.gamma + 1, 1) if self.fallback is not None else (self.gamma + 1,):
                self.decoders[width] = GraphedDecoder(model, self.cache, scratch_row=n, tokens_per_row=width,
                                                      logits="all", return_taps=True, compile=compiled)
        # the drafter rings match: row n is the scratch row a draft bucket's padding rows read
        block_rows = (self.gamma + 1, compiled_ring_rows(model)) if compiled else None
        self.rings = DrafterCache(model, n + 1 if graphed else n, self.cache.margin, block_rows)
        self.drafter = GraphedDrafter(model, self.rings, scratch_row=n, compile=compiled) if graphed else None
        self.calibration = cfg.calibration(self.gamma)            # auto: confidences scaled by the run's verdicts
        self.res = SpeculativeResult.for_prompts(prompts)
        self.out = Emitter(self.res, self.max_new, self.args.max_seq_len, request.stop_tokens, self.trace, token_text,
                           on_token)
        self.active: list[int] = []
        self.anchors: dict[int, int] = {}     # row → its anchor: the last committed token, not yet processed
        self.n_steps = 0
        self.building = False

    def prefill(self) -> None:
        """Prompts of equal length go together (no padding enters any computation), a long one in consecutive
        chunks of prefill_chunk tokens; the taps fill the drafter rings for every prompt position, and the target's
        last logits give each row its first anchor."""
        by_len: dict[int, list[int]] = {}
        for row, ids in enumerate(self.prompts):
            by_len.setdefault(len(ids), []).append(row)
            self.out.record_prompt(row, ids)          # with a trace: the prefill scores each prompt token
        model, dev = self.model, self.model.device
        for length, group in by_len.items():
            t0 = time.perf_counter()
            ids = torch.tensor([self.prompts[r] for r in group], device=dev)      # [G, length]
            for start in range(0, length, self.prefill_chunk):   # consecutive chunks through the same caches
                logits, taps = model(ids[:, start:start + self.prefill_chunk], self.cache, rows=torch.tensor(group),
                                     trace=self.trace, logits="last", interventions=self.interventions,
                                     prompt_logits=True)
                self.rings.append(model, taps, group)                         # taps [G, chunk, n_taps·dim]
            dt = elapsed(t0, dev)
            self.res.prefill_s += dt
            if self.max_new == 0:
                for r in group:
                    self.res.finish_reasons[r] = "length"
                continue
            check_finite_logits(logits, lambda i: f"after the prefill of row {group[i]} (choosing the token at "
                                                  f"position {length})")
            scores = apply_history_rules(logits, [self.prompts[r] for r in group], self.params)
            p = probabilities(scores, self.params)                             # [G, V]
            chosen = p.argmax(-1) if self.params.greedy else draw(p, [self.gens[r] for r in group])
            for i, r in enumerate(group):
                token = int(chosen[i])
                if self.out.emit(r, length, token, 0, dt, logits[i], float(p[i, token])):
                    self.active.append(r)
                    self.anchors[r] = token
        self.active.sort()

    def step(self) -> None:
        """One DSpark step for every active row: draft γ (GraphedDrafter with cuda_graphs), schedule ℓ per row,
        verify [anchor, x_1..x_ℓ] in one target forward (graphed: the full γ-block), roll every cache back to
        the committed prefix, emit the accepted drafts + one token."""
        model, dev, active = self.model, self.model.device, self.active
        self.n_steps += 1
        t0 = time.perf_counter()
        rows = torch.tensor(active)
        anchor_pos = self.cache.pos[rows].clone()                              # [A] each anchor's position
        anchors = torch.tensor([self.anchors[r] for r in active])
        gens = [self.gens[r] for r in active]
        self.building = False   # set when a graphed body lays out (compiles, captures) a bucket: a step timed apart
        if self.fallback is not None and not self.fallback.drafts():
            return self._plain_step(rows, anchor_pos, anchors, t0)
        t_catch = time.perf_counter()
        self.rings.catch_up(model, rows)                                       # the taps plain steps deferred
        owed = time.perf_counter() - t_catch                                   # plain steps' work, not this step's
        try:
            if self.drafter is not None and not self.params.uses_history:  # the graph drafts without the rules
                d = self.drafter.draft(rows, anchors, self.params, gens, self.trace)
                self.res.graphed_drafts += 1
                self.building = self.drafter.built
            else:
                histories = [self.prompts[r] + self.res.tokens[r] for r in active] if self.params.uses_history \
                    else None
                d = draft(model, self.rings, rows, anchors, self.params, gens, self.trace, self.interventions,
                          histories)
        except NonFiniteLogitsError as e:  # a sampled draft's distribution
            raise NonFiniteLogitsError(f"DSpark step {self.n_steps} (the drafter's sampling): {e}") from None
        check_finite_logits(d.confidence_logits, lambda i: f"of the DSpark drafter's confidence head at step "
                                                           f"{self.n_steps} (row {active[i]})")
        raw = d.confidence(self.temperature)                                   # [A, γ]
        conf = raw if self.calibration is None else self.calibration(raw)
        # eager, with plain steps to fall back on: a step that drafted verifies at least its first draft; graphed,
        # the block costs the same whatever ℓ, so the choice is every draft or (with a plain forward) none
        lengths = self._capped(self.cfg.lengths(conf, least=int(self.fallback is not None),
                                                block_over_plain=self._block_over_plain()), anchor_pos)
        width = max(lengths) + 1
        none = width == 1 and 1 in self.decoders                              # graphed: the one-token decoder
        logits, taps = self._target_forward(rows, anchors, d.tokens[:, :0] if none else d.tokens, width)
        check_finite_logits(logits, lambda i: f"in the verify forward of DSpark step {self.n_steps} (row {active[i]}, "
                                              f"positions {int(anchor_pos[i])}..{int(anchor_pos[i]) + width - 1})")
        self.rings.append(model, taps, rows)                                   # [A, w, V], [A, w, n_taps·dim]
        self.res.target_forwards += 1
        verdicts = self._verify(d, lengths, logits)
        accepted = [v.accepted for _, v in verdicts]
        if self.calibration is not None:
            self.calibration.update(raw, lengths, accepted)
        keep = anchor_pos + 1 + torch.tensor([v.accepted for _, v in verdicts])  # committed: anchor + accepted
        self.cache.rollback(keep, rows)
        self.rings.rollback(keep, rows)
        dt = elapsed(t0, dev)
        self.res.decode_s += dt
        self.res.step_times.append(dt)
        if self.fallback is not None:  # did drafting pay? (else the next steps are plain)
            self.fallback.judge(conf, lengths, accepted, None if self.building else dt - owed)
        self._commit(d, conf, lengths, verdicts, logits, anchor_pos, keep, dt)

    def _plain_step(self, rows, anchor_pos, anchors, t0) -> None:
        """A step without a draft (engine.dspark.fallback.PlainFallback): the anchors alone through the target,
        their taps deferred to the drafter's next catch-up, the next token the verifier picks with no drafts
        (plain decoding's choice: the argmax, or a draw from the target's distribution). No DSpark step record."""
        model, A = self.model, len(self.active)
        logits, taps = self._target_forward(rows, anchors, anchors.new_zeros(A, 0), 1, plain=True)   # [A, 1, V]
        check_finite_logits(logits, lambda i: f"in plain step {self.n_steps} of the DSpark run (row "
                                              f"{self.active[i]}, position {int(anchor_pos[i])})")
        self.rings.defer(taps, rows)
        if self.params.greedy and not self.params.uses_history:  # the argmax, as _verify finds it with no drafts
            verdicts = [(None, Verdict(accepted=0, token=t, bonus=True)) for t in logits[:, 0].argmax(-1).tolist()]
        else:
            no_draft = Draft(torch.zeros(A, 0, dtype=torch.long), None if self.params.greedy else
                             logits.new_zeros(A, 0, logits.size(-1)), torch.zeros(A, 0))
            verdicts = self._verify(no_draft, [0] * A, logits)
        dt = elapsed(t0, model.device)
        if not self.building:
            self.fallback.plain_step(A, dt)
        self.res.decode_s += dt
        self.res.plain_s += dt
        self.res.plain_steps += 1
        self.res.step_times.append(dt)
        still = []
        for i, r in enumerate(self.active):
            p, v = verdicts[i]
            if self.out.emit(r, int(anchor_pos[i]) + 1, v.token, self.n_steps, dt, logits[i, 0],
                             1.0 if p is None else float(p[0, v.token])):
                self.anchors[r] = v.token
                still.append(r)
        self.active = still

    def _block_over_plain(self) -> float | None:
        """Graphed: the verify block's seconds over a plain forward's, from this run's own forwards (running means);
        1 until both widths have run (or without a plain forward), so that the step verifies every draft. (The
        profiled table times eager forwards, whose widths cost other ratios.) Eager: None."""
        if not self.decoders:
            return None
        block, plain = self.forward_s.get(self.gamma + 1), self.forward_s.get(1)
        return 1.0 if block is None or plain is None else block / plain

    def _target_forward(self, rows, anchors, drafts, width: int, plain: bool = False):
        """The verify forward of [anchor, drafts…] per row → (logits [A, w, V], taps [A, w, n_taps·dim]).
        Eager: w = width (the batch's longest scheduled block; shorter rows are padded with their next
        drafts). Graphed: w = 1 + the drafts given (γ, or none) for every row, the trace given only the first `width`
        tokens' records as the eager forward would make them; the caller's rollback discards the extra positions
        either way. `plain`: a plain step's forward (counted as such)."""
        full = 1 + drafts.size(1)                                              # γ + 1, or 1: no drafts
        decoder = self.decoders.get(full)
        if decoder is not None and bool((self.cache.pos[rows] + full <= self.cache.max_seq_len).all()):
            block = torch.cat([anchors.unsqueeze(1), drafts], 1)               # [A, γ+1] or [A, 1]
            t0 = time.perf_counter()
            out = decoder.step(block, rows, self.trace, trace_tokens=width)
            if plain:
                self.res.graphed_plain_steps += 1
            else:
                self.res.graphed_forwards += 1
            seconds = elapsed(t0, self.model.device)
            if decoder.built:
                self.building = True
            else:
                old = self.forward_s.get(full)
                self.forward_s[full] = seconds if old is None else old + self.FORWARD_WEIGHT * (seconds - old)
            return out
        block = torch.cat([anchors.unsqueeze(1), drafts[:, :width - 1]], 1)    # [A, w]; rows with ℓ < w − 1 padded
        return self.model(block.to(self.model.device), self.cache, rows=rows, trace=self.trace, logits="all",
                          interventions=self.interventions)

    def _capped(self, lengths: list[int], anchor_pos: torch.Tensor) -> list[int]:
        """Never verify past a row's token budget or the model's last position: a step emits ℓ + 1 tokens."""
        out = []
        for i, r in enumerate(self.active):
            room = min(self.max_new - len(self.res.tokens[r]), self.args.max_seq_len - 1 - int(anchor_pos[i])) - 1
            out.append(max(0, min(lengths[i], room)))
        return out

    def _verify(self, d, lengths, logits) -> list:
        """(p [ℓ+1, V] or None when greedy, Verdict) per active row."""
        out, rules = [], self.params.uses_history
        target_ids = logits.argmax(-1).cpu() if self.params.greedy and not rules else None  # [A, w]
        for i, r in enumerate(self.active):
            ell = lengths[i]
            scores = logits[i, :ell + 1]                                       # [ℓ+1, V]
            if rules:  # position k follows the committed tokens (anchor last) and drafts 1..k
                past, drafts = self.prompts[r] + self.res.tokens[r], d.tokens[i, :ell].tolist()
                scores = apply_history_rules(scores, [past + drafts[:k] for k in range(ell + 1)], self.params)
            if self.params.greedy:
                ids = target_ids[i, :ell + 1] if target_ids is not None else scores.argmax(-1).cpu()
                out.append((None, verify_greedy(d.tokens[i, :ell], ids)))
                continue
            p = probabilities(scores, self.params)                             # [ℓ+1, V]
            out.append((p, self.verifier(d.tokens[i, :ell].to(p.device), d.q[i, :ell], p, generator=self.gens[r])))
        return out

    def _commit(self, d, conf, lengths, verdicts, logits, anchor_pos, keep, dt) -> None:
        still, q_drafts = [], d.draft_probs().float().cpu().numpy()            # [A, γ]
        survival = np.cumprod(conf.numpy(), axis=1)                            # [A, γ]
        for i, r in enumerate(self.active):
            p, v = verdicts[i]
            if self.trace is not None:
                self.trace.rollback(r, int(keep[i]))  # the target's facts of rejected positions
            rec = DSparkStep(row=r, step=self.n_steps, anchor_pos=int(anchor_pos[i]), anchor_token=self.anchors[r],
                             drafted=d.tokens[i].numpy(), draft_probs=q_drafts[i], confidences=conf[i].numpy(),
                             survival=survival[i], verify_len=lengths[i], accepted=v.accepted, next_token=v.token,
                             next_kind="bonus" if v.bonus else "replacement", time_s=dt)
            self.res.steps.append(rec)
            if self.trace is not None:
                self.trace.record_dspark_step(rec)
            alive = True
            out = [int(t) for t in d.tokens[i, :v.accepted]] + [v.token]
            for k, tok in enumerate(out):  # target logits at position anchor+k chose the token at anchor+k+1
                prob = 1.0 if p is None else float(p[k, tok])
                alive = self.out.emit(r, int(anchor_pos[i]) + 1 + k, tok, self.n_steps, dt, logits[i, k], prob)
                if not alive:
                    break
            if alive:
                self.anchors[r] = v.token
                still.append(r)
        self.active = still
