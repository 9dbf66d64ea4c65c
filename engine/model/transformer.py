"""Transformer (spec §4.1): embed → hc streams → Engram + blocks → collapse (last pre, or V4's hc_head) → norm →
head."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..request.interventions import Intervention
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..spec.roles import family_roles
from .block import Block
from .cache import ModelCache, Rows
from .context import ForwardContext
from .draft import DraftStage, MTPStage
from .engram import DEAD, NgramRows
from .indexer_loss import IndexerLoss
from .interventions import Interventions
from .lens_reads import LensReads
from .linear import Linear
from .mhc import HCHead, collapse
from .moe import MoE
from .norm import RMSNorm
from .options import EngineOptions

if TYPE_CHECKING:  # the trace records what the model computes: named for annotations only
    from ..trace import Trace

# logits a forward with prompt_logits hands to the trace at once (64 MiB in fp32): a long prompt's every-position
# logits would otherwise be S × vocabulary values at once
PROMPT_LOGITS_VALUES = 2**24


class ForwardOutput(NamedTuple):
    """What a forward returns: logits [B, V] or [B, S, V] (fp32; float64 for a float64 model) and taps
    [B, S, n_taps·dim], the DSpark drafter's features (None for a model without DSpark target layers)."""
    logits: torch.Tensor
    taps: torch.Tensor | None


class Transformer(HCHead):
    """Both families on one code path; what differs is read from the roles (engine.spec.roles): per layer
    (compression, KV and index sources, hash routing, Engram) and per family (single-pass mHC or V4's hc_head)."""

    def __init__(self, args: ModelArgs, token_map: np.ndarray | torch.Tensor | None = None, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 options: EngineOptions | None = None) -> None:
        super().__init__()
        self.args, self.options = args, options or EngineOptions()
        self.family = family_roles(args)
        if self.options.bounded_replay and not args.kv_source_layers:
            raise InputError(f"EngineOptions.bounded_replay needs shared KV sources (V4.1); config "
                             f"'{args.name or args.model_type}' has none (V4: every compressed layer compresses)")
        self.margin = self.options.margin_for(args.dspark_block_size)
        kw = dict(dtype=dtype, device=device)
        roles = args.roles
        self.embed = nn.Embedding(args.vocab_size, args.dim, **kw)
        self.layers = nn.ModuleList(Block(args, roles[i], **kw) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, **kw)
        self.head = Linear(args.dim, args.vocab_size, **kw)
        if self.family.hc_head:
            self.add_hc_head(args, **kw)
        stages = range(args.n_layers, args.n_layers + args.n_draft_stages)
        self.mtp = nn.ModuleList(DraftStage(args, roles[i], i - args.n_layers, **kw) if args.has_dspark
                                 else MTPStage(args, roles[i], **kw) for i in stages)
        self.ngram = NgramRows(args) if args.has_engram else None
        self.tapped = set(args.dspark_target_layer_ids)
        self.token_map: torch.Tensor | None = None
        if token_map is not None:
            self.set_token_map(token_map)
        self._set_act_quant()

    # ---- setup ------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def set_token_map(self, token_map: np.ndarray | torch.Tensor | None) -> None:
        """The Engram compressed-token map (spec §4.4.1): int array, one compressed id per token id."""
        a = np.asarray(token_map)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"token_map must be a 1-D integer array, got shape {a.shape} dtype {a.dtype}")
        if a.shape[0] < self.args.vocab_size:
            raise InputError(f"token_map has {a.shape[0]} entries; it needs one per token id (vocab_size "
                             f"{self.args.vocab_size})")
        limit = self.args.engram_compressed_vocab_size
        if a.size and (a.min() < 0 or a.max() >= limit):
            raise InputError(f"token_map values must lie in 0..{limit - 1} (engram_compressed_vocab_size), "
                             f"found {a.min()}..{a.max()}")
        self.token_map = torch.from_numpy(a.astype(np.int64))

    def _set_act_quant(self) -> None:
        """FP8 input quant-dequant on linears whose official weights are FP8 (dense) or FP4 (routed experts)."""
        a, opt = self.args, self.options.act_quant
        dense = a.dtype == "fp8" if opt is None else opt
        expert = (a.expert_dtype in ("fp4", "fp8") or (not a.expert_dtype and a.dtype == "fp8")) if opt is None else opt
        for m in self.modules():
            if isinstance(m, Linear):
                m.act_quant = m.quantized and dense
        for m in self.modules():
            if isinstance(m, MoE):
                for e in m.experts:
                    e.w1.act_quant = e.w2.act_quant = e.w3.act_quant = expert

    def new_cache(self, batch_size: int, max_seq_len: int | None = None) -> ModelCache:
        return ModelCache(self, batch_size, max_seq_len or self.args.max_seq_len, self.margin)

    # ---- forward ----------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, cache: ModelCache | None = None, *, rows: Rows | None = None,
                trace: Trace | None = None, logits: str = "last", image_mask: torch.Tensor | None = None,
                indexer_loss: IndexerLoss | None = None,
                interventions: Interventions | Iterable[Intervention | str] | None = None,
                prompt_logits: bool = False) -> ForwardOutput:
        """tokens [B, S] → ForwardOutput: logits [B, V] ("last") or [B, S, V] ("all"), fp32 (float64 for a
        float64 model), and taps, main_hidden [B, S, n_taps·dim] (mean over streams of the residual entering
        each DSpark target layer; None without DSpark).

        Row b occupies positions cache.pos[rows[b]] .. + S − 1 and the cache advances by S. cache=None runs
        a stateless forward from position 0. With bounded_replay and S > window, "all" logits and taps
        cover only the last window positions. indexer_loss: an IndexerLoss that collects the indexer's
        auxiliary loss (training; the outputs do not change). interventions: what-if changes (an Interventions,
        or Intervention items / texts checked against the config; engine.request.interventions), at absolute positions.
        prompt_logits (with a trace): every position's logits also go to trace.record_prompt_logits, which scores
        the prompt tokens they predict (the Inspect page's prompt probabilities), PROMPT_LOGITS_VALUES at a time so
        that they stay bounded; the returned logits are those of `logits`, computed as without it.
        """
        tokens = self.check_tokens(tokens)
        if logits not in ("last", "all"):
            raise InputError(f"logits must be 'last' or 'all', got {logits!r}")
        B, S = tokens.shape
        if cache is None:
            if rows is not None:
                raise InputError("rows= needs a cache")
            cache = self.new_cache(B, S)
        row_ids = cache.resolve_rows(rows, B)
        cache.check_room(row_ids, S)
        start = cache.pos[row_ids].clone()
        positions = start.unsqueeze(1) + torch.arange(S)                      # [B, S] CPU
        if image_mask is not None:
            if not self.family.vision_bias:
                why = "V4 family" if self.args.family == "v4" else "no vision tower: vision_n_layers is 0"
                raise InputError(f"image_mask given, but config '{self.args.name or self.args.model_type}' ({why}) "
                                 "has no image tokens")
            image_mask = torch.as_tensor(image_mask, dtype=torch.bool)
            if image_mask.shape != tokens.shape:
                raise InputError(f"image_mask shape {tuple(image_mask.shape)} must equal tokens shape {(B, S)}")
        dev = self.device
        ctx = ForwardContext(cache=cache, rows=row_ids, start=start, n_tokens=S, positions=positions.to(dev),
                             options=self.options, image_mask=None if image_mask is None else image_mask.to(dev),
                             trace=trace, indexer_loss=indexer_loss,
                             interventions=Interventions.of(interventions, self.args))
        engram = self.engram_rows(tokens.cpu(), image_mask, cache, row_ids, positions)
        out = self.run_layers(tokens.to(dev), ctx, engram, logits, prompt_logits=prompt_logits and trace is not None)
        cache.advance(row_ids, S)
        return out

    def run_layers(self, tokens: torch.Tensor, ctx: ForwardContext,
                   engram: tuple[torch.Tensor, torch.Tensor] | None, logits: str = "last",
                   prompt_logits: bool = False) -> ForwardOutput:
        """The device part of forward: tokens [B, S] on the model's device, a prepared context and the
        hashed Engram rows (row ids [B, S, L, cols], compressed ids [B, S]) → ForwardOutput.
        Reads and writes ctx.cache's tensors in place; touches none of the host bookkeeping (pos, history).
        With a static context no width depends on a value (the CUDA-graph decode body: engine.graphs.static_context;
        it also runs the MoE and Sinkhorn under engine.speedups.sync_free so that nothing reads back to the host)."""
        a, dev = self.args, self.device
        B, S = tokens.shape
        ctx.tokens = tokens                                                    # V4 hash routing reads the ids
        h = self.embed(tokens)                                                 # [B, S, dim]
        h = h.unsqueeze(2).repeat(1, 1, a.hc_mult, 1)                          # [B, S, hc, dim]
        pre = torch.zeros(B, S, a.hc_mult, dtype=torch.float64 if self.dtype == torch.float64 else torch.float32,
                          device=dev)
        pre[..., 0] = 1.0                                                      # layer 0 collapses stream 0
        replay_from = max(a.kv_source_layers) + 1 if self.options.bounded_replay and S > a.window_size else None
        taps = []
        lens = LensReads(self, B * S, ctx) if self.records_lens(ctx.trace) else None
        for i, layer in enumerate(self.layers):
            if i == replay_from:  # spec §5: later layers only over the last window tokens (approximate)
                W = a.window_size
                h, pre, ctx = h[:, -W:], pre[:, -W:], ctx.tail(W)
                taps = [t[:, -W:] for t in taps]
                engram = None if engram is None else (engram[0][:, -W:], engram[1][:, -W:])
            if layer.role.engram:
                h = self._apply_engram(layer, h, engram, ctx)
            if i in self.tapped:
                taps.append(h.mean(2))
            h_in = h
            h, pre = layer(h, pre, ctx)
            if lens is not None:
                lens.add(layer.path, h_in, h, pre, ctx)
        x = self.readout(h, pre) if lens is None else lens.finish(h, pre, ctx)   # (the lens's last read-out, if made)
        if prompt_logits:
            self.score_positions(x, ctx)
        if logits == "last":
            x = x[:, -1]
        return ForwardOutput(self.vocab_logits(x), torch.cat(taps, -1) if taps else None)

    def score_positions(self, x: torch.Tensor, ctx: ForwardContext) -> None:
        """The head's input x [B, S', dim] (the call's last S' positions) → each position's logits, into
        ctx.trace.record_prompt_logits a slice of at most PROMPT_LOGITS_VALUES logits at a time."""
        rows, positions = ctx.trace_rows()
        chunk = max(1, PROMPT_LOGITS_VALUES // self.args.vocab_size)
        first = positions[:, -x.size(1)].tolist()                               # [B] position of x[:, 0]
        for b, row in enumerate(rows.tolist()):
            for j in range(0, x.size(1), chunk):
                ctx.trace.record_prompt_logits(row, first[b] + j, self.vocab_logits(x[b, j:j + chunk]))

    def readout(self, h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """hc streams h [B, S, hc, dim] → the final norm's output [B, S, dim], the head's input: V4.1 collapses
        with `pre`, the last site's pre, which the next consumer of h would collapse with (the next layer's
        attention, or this read-out); V4 with its learned hc_head (spec §4.1, §4.6)."""
        return self.norm(self.hc_head(h) if self.family.hc_head else collapse(h, pre))

    # ---- logit lens -------------------------------------------------------------------------------
    def records_lens(self, trace: object | None) -> bool:
        """Whether this forward may record the logit lens (at each layer where trace.wants_lens; see
        engine.model.lens_reads): with a trace that takes it (a stand-in without wants_lens does not), and a head
        that is this process's own. Under torch.distributed the vocabulary-parallel head gathers across ranks, a
        collective that the rank reading its trace would run alone: there the lens is not recorded."""
        return hasattr(trace, "wants_lens") and getattr(self, "world", None) is None

    def lens_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Recorded read-outs [N, dim] (on the host) → logits [N, V] (fp32): the head the trace resolves the
        logit lens with."""
        return self.vocab_logits(x.to(self.device))

    def vocab_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Normed hidden [..., dim] → logits [..., V] in fp32 (float64 for a float64 model). One method, so the
        vocabulary-parallel transform (engine.parallel) can gather the logits its ranks compute in slices."""
        out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        return F.linear(x.to(out_dtype), self.head.weight.to(out_dtype))

    def check_tokens(self, tokens: torch.Tensor | Sequence[Sequence[int]]) -> torch.Tensor:
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 2:
            raise InputError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        if tokens.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
            raise InputError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.size(1) == 0:
            raise InputError("tokens is empty: need at least one token per row")
        if tokens.min() < 0 or tokens.max() >= self.args.vocab_size:
            raise InputError(f"token ids must lie in 0..{self.args.vocab_size - 1}, found "
                             f"{int(tokens.min())}..{int(tokens.max())}")
        return tokens.long()

    def engram_rows(self, tokens: torch.Tensor, image_mask: torch.Tensor | None, cache: ModelCache, rows: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Record this call's compressed ids in the rows' history and hash every Engram column."""
        if self.ngram is None:
            return None
        if self.token_map is None:
            raise InputError("this model has Engram layers: pass token_map (engine.text.engram_map) "
                             "to Transformer(...) or call model.set_token_map(...) before running it")
        comp = self.token_map[tokens]                                          # [B, S]
        if image_mask is not None:
            comp = comp.masked_fill(image_mask.cpu(), DEAD)
        cache.engram_history[rows.unsqueeze(1), positions] = comp
        pad = int(self.token_map[self.args.engram_pad_id])
        ids = self.ngram(cache.engram_history[rows], positions, pad)          # [B, S, L, cols]
        return ids, comp

    def _apply_engram(self, layer, h, engram, ctx):
        row_ids, comp = engram
        live = None if ctx.image_mask is None else ~ctx.image_mask
        off = ctx.interventions.engram_off(layer.role.layer, ctx.positions)   # [B, S] or None
        if off is not None:  # intervention: Engram adds nothing there (its gate is 0, and recorded as 0)
            live = ~off if live is None else live & ~off
        ids = row_ids[:, :, layer.engram.slot]                                 # [B, S, cols]
        h, gates = layer.engram(h, ids, live)
        if ctx.trace is not None:
            rows, pos = ctx.trace_rows()
            ctx.trace.record_engram(f"{layer.path}.engram", rows, pos, comp, ids, gates)
        return h
