"""GraphedDecoder: decode (or fixed-width verify) steps replayed from one CUDA graph per batch bucket (eager on CPU)."""
from __future__ import annotations

import torch

from ..model import ForwardOutput
from ..placement import refuse_host_experts
from ..spec.errors import InputError
from ..speedups import apply_speedups
from ..speedups.fast_moe import build_expert_stacks
from .buckets import bucket_for
from .compiled_body import compiled_body, ran_slowly
from .cuda_capture import capture_cuda_graph
from .decode_body import decode_body
from .replay_mode import capture_for, scratch_row_for
from .static_inputs import DecodeInputs
from .trace_buffers import TraceBuffers


class _Bucket:
    """One bucket's static buffers, trace buffers and (on CUDA, once captured) its graph."""

    def __init__(self, inputs: DecodeInputs, sink: TraceBuffers | None):
        self.inputs, self.sink = inputs, sink
        self.graph = None
        self.laid_out = False


class GraphedDecoder:
    """Decode steps of `model` over `cache` at bucketed batch sizes (1, 2, 4, …).

    Each step: hash the Engram rows and check room on the host, copy the inputs into the bucket's static
    buffers, run the body — on CUDA by replaying the graph captured at the bucket's first step, elsewhere
    by calling it eagerly on the same buffers ("eager replay": identical code and buffers, no speed-up) —
    then advance cache.pos and copy the logits (and trace records) out.

    `scratch_row`: a cache row no sequence uses (default: the cache's last row); padding rows of a bucket
    write there. A captured graph holds the addresses of the cache tensors and the weights as they were
    at capture: build a new GraphedDecoder after replacing weights or the cache (in-place updates and
    cache.reset/rollback are fine). `min_bucket`: the smallest bucket used (e.g. 8 to capture one graph for
    every batch up to 8 rows).

    `tokens_per_row` S > 1 makes each step a fixed-width block per row — the shape of a DSpark verify
    forward (anchor + γ drafts) — with logits "all" ([n, S, V]) and, with return_taps, the drafter's
    taps [n, S, n_taps·dim]; the caller rolls the cache back to the accepted prefix as in eager decoding.

    The body needs the sync-free expert paths of engine.speedups: a model built without them gets them here.

    `compile=True` runs the untraced body through torch.compile (inductor; on the CPU, generated C++): one
    compiled graph per bucket instead of thousands of small ops a step, at the price of compiling first
    (minutes on a small CPU; inductor's cache on disk makes later processes much faster). Results equal the
    eager body's up to float rounding (fused kernels sum in other orders). Like a captured graph, a compiled
    body holds the weights as traced: build a new decoder after replacing weights. Not combined with capture.
    """

    def __init__(self, model, cache, *, scratch_row: int | None = None, capture: bool | None = None,
                 warmup: int = 2, min_bucket: int = 1, tokens_per_row: int = 1, logits: str = "last",
                 return_taps: bool = False, compile: bool = False):
        refuse_host_experts(model, "a CUDA-graphed or compiled decode step")
        self.model, self.cache = apply_speedups(model), cache
        self.scratch_row = scratch_row_for(scratch_row, cache.batch_size, "the cache's")
        if compile and capture:
            raise InputError("compile=True and capture=True: a compiled decode body is not also graph-captured")
        self.capture = False if compile else capture_for(model, capture)
        self.compiled = compiled_body(self.model) if compile else None
        if compile:
            build_expert_stacks(self.model.layers)
        self.warmup, self.min_bucket = warmup, bucket_for(min_bucket)
        if tokens_per_row < 1:
            raise InputError(f"tokens_per_row must be at least 1, got {tokens_per_row}")
        if model.options.bounded_replay and tokens_per_row > model.args.window_size:
            raise InputError("bounded_replay slices blocks longer than the window: use tokens_per_row ≤ window_size")
        if logits not in ("last", "all"):
            raise InputError(f"logits must be 'last' or 'all', got {logits!r}")
        self.tokens_per_row, self.logits_mode, self.return_taps = tokens_per_row, logits, return_taps
        self._buckets: dict[tuple[int, tuple[frozenset, frozenset] | None], _Bucket] = {}
        self.built = False   # the last step laid out its bucket (a capture, a compile, a trace layout: slower)
        roles = model.args.roles[: model.args.n_layers]
        # attention path → ratio of the compressed rows its index list points into (for the trace's top-k width)
        self._topk_ratio = {f"{r.path}.attn": cache.ratio[r.kv_source] for r in roles if r.ratio}
        self.attention_paths = [f"{r.path}.attn" for r in roles]
        self.layer_paths = [r.path for r in roles]   # (the logit lens records per layer)

    @property
    def captured(self) -> list[int]:
        """Bucket sizes that replay a captured CUDA graph."""
        return sorted({b for (b, _), st in self._buckets.items() if st.graph is not None})

    def step(self, tokens, rows, trace=None, trace_tokens: int | None = None):
        """tokens [n, S] (or [n] when S = 1) next tokens of each sequence, rows [n] their cache rows →
        ForwardOutput: logits [n, V] ("last") or [n, S, V] ("all") and, with return_taps, taps (else None),
        fresh tensors. Each row's tokens go at cache.pos onwards, which then advances by S. trace_tokens
        k ≤ S: hand `trace` only each row's first k tokens' records — what an eager forward of width k
        records (a DSpark verify whose schedule needs a narrower block than the graph's), so a token budget
        fills alike."""
        if torch.is_grad_enabled():
            raise RuntimeError("GraphedDecoder.step runs under torch.no_grad() or torch.inference_mode()")
        cache, model = self.cache, self.model
        S = self.tokens_per_row
        k = S if trace_tokens is None else int(trace_tokens)
        if not 1 <= k <= S:
            raise InputError(f"trace_tokens must be in 1..{S} (the step's tokens per row), got {trace_tokens!r}")
        tokens = model.check_tokens(torch.as_tensor(tokens).reshape(-1, S)).cpu()   # [n, S]
        n = tokens.size(0)
        rows = cache.resolve_rows(rows, n)
        if (rows == self.scratch_row).any():
            raise InputError(f"cache row {self.scratch_row} is the decoder's scratch row (padding writes "
                             "there): give the sequences other rows, or a cache with one more row")
        cache.check_room(rows, S)
        start = cache.pos[rows].clone()                                               # [n]
        positions = start.unsqueeze(1) + torch.arange(S)                              # [n, S]
        engram = model.engram_rows(tokens, None, cache, rows, positions)
        key = (max(bucket_for(n), self.min_bucket), None if trace is None else
               (frozenset(p for p in self.attention_paths if trace.wants_attention(p)),
                frozenset(p for p in self.layer_paths if model.records_lens(trace) and trace.wants_lens(p))))
        st = self._buckets.get(key)
        if st is None:
            inputs = DecodeInputs(model, key[0], self.scratch_row, S, self.logits_mode, self.return_taps)
            st = self._buckets[key] = _Bucket(inputs, None if trace is None else TraceBuffers(*key[1]))
        st.inputs.fill(tokens, start, rows, engram)
        self.built = ran_slowly(lambda: self._run(st), self._compiles(st), not st.laid_out)
        cache.advance(rows, S)
        if trace is not None:
            shown = positions[:, :k]                                                  # [n, k]
            st.sink.emit(trace, rows, shown, n, self._topk_width(shown))
        taps = st.inputs.taps[:n].clone() if self.return_taps else None
        return ForwardOutput(st.inputs.logits[:n].clone(), taps)

    def _compiles(self, st: _Bucket) -> bool:
        """Whether this bucket's steps run the compiled body (a traced step runs the eager body)."""
        return self.compiled is not None and st.sink is None

    def _run(self, st: _Bucket) -> None:
        def body():
            run = self.compiled if self._compiles(st) else decode_body
            run(self.model, self.cache, st.inputs, st.sink)

        if st.graph is not None:
            st.graph.replay()
            return
        body()  # eager: the layout run of the trace buffers, or eager replay on CPU
        if not st.laid_out:
            if st.sink is not None:
                st.sink.freeze()
            st.laid_out = True
            if self.capture:  # the step's outputs are already written; warm-up and capture rewrite the same
                st.graph = capture_cuda_graph(body, self.warmup)

    def _topk_width(self, positions: torch.Tensor):
        """The index-list width the eager path records: min(index_topk, the live rows' widest visible count)
        (positions [n, S])."""
        k = self.model.args.index_topk

        def width(path: str) -> int:
            r = self._topk_ratio.get(path)
            return 0 if r is None else min(k, int(((positions + 1) // r).max()))
        return width
