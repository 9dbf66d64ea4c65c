"""GraphedDrafter: DSpark draft steps whose block forward replays one CUDA graph per batch bucket (eager on CPU)."""
from __future__ import annotations

import torch

from ..dspark.drafter import Draft, markov_drafts
from ..placement import refuse_host_experts
from ..spec.errors import InputError
from ..speedups import apply_speedups
from ..speedups.fast_moe import build_expert_stacks
from .buckets import bucket_for
from .compiled_body import compiled_draft_body, ran_slowly
from .cuda_capture import capture_cuda_graph
from .draft_body import DraftInputs, draft_body
from .replay_mode import capture_for, scratch_row_for
from .trace_buffers import TraceBuffers


class _DraftBucket:
    def __init__(self, inputs: DraftInputs, sink: TraceBuffers | None, greedy: bool):
        self.inputs, self.sink, self.greedy = inputs, sink, greedy
        self.graph = None
        self.laid_out = False


class GraphedDrafter:
    """engine.dspark.drafter.draft, with the device part from static buffers (engine.graphs.draft_body).

    Graphed: every draft stage (attention over the gathered ring rows + the block, MoE, mHC), the last
    stage's norm and the base logits; when greedy also the Markov head's left-to-right argmax drafts and the
    confidence head (argmax needs no host value). Eager, when sampling: the Markov head per position, the
    draw with each row's torch.Generator (host-seeded, consumed exactly as the eager drafter does) and the
    confidence head — run on the graph's hidden/base outputs, so the draws are those of the eager path.

    `rings`: the DrafterCache; `scratch_row` (default its last row) is read by a bucket's padding rows and
    must hold no sequence. On CUDA the graph holds the rings' and weights' addresses at capture: build a new
    GraphedDrafter after replacing either (append/rollback of the rings are fine). The body needs the
    sync-free expert paths of engine.speedups: a model built without them gets them here.

    `compile=True` runs the untraced body through torch.compile instead (as GraphedDecoder's compile: one compiled
    graph per bucket and greedy flag, compiled on first use; drafts equal the eager body's up to float rounding).
    """

    def __init__(self, model, rings, *, scratch_row: int | None = None, capture: bool | None = None,
                 warmup: int = 2, min_bucket: int = 1, compile: bool = False):
        if not len(model.mtp):
            raise InputError("GraphedDrafter: the model has no DSpark draft stages")
        refuse_host_experts(model, "a CUDA-graphed or compiled draft step")
        self.model, self.rings = apply_speedups(model), rings
        self.scratch_row = scratch_row_for(scratch_row, rings.batch_size, "the drafter cache's")
        if compile and capture:
            raise InputError("compile=True and capture=True: a compiled draft body is not also graph-captured")
        self.capture = False if compile else capture_for(model, capture)
        self.compiled = compiled_draft_body(self.model) if compile else None
        if compile:
            build_expert_stacks(self.model.mtp)
        self.warmup, self.min_bucket = warmup, bucket_for(min_bucket)
        self._buckets: dict[tuple[int, bool, bool], _DraftBucket] = {}
        self.built = False   # the last draft laid out its bucket (a capture, a compile, a trace layout: slower)

    @property
    def captured(self) -> list[int]:
        return sorted({b for (b, _, _), st in self._buckets.items() if st.graph is not None})

    def draft(self, rows, anchors, params, generators: list, trace=None) -> Draft:
        """Same arguments and result as engine.dspark.drafter.draft (minus model and rings)."""
        if torch.is_grad_enabled():
            raise RuntimeError("GraphedDrafter.draft runs under torch.no_grad() or torch.inference_mode()")
        rings, model = self.rings, self.model
        rows = rings._rows(rows)
        n, G = rows.numel(), model.args.dspark_block_size
        if not n:
            raise InputError("a draft step needs at least one row")
        if (rows == self.scratch_row).any():
            raise InputError(f"drafter row {self.scratch_row} is the scratch row (padding reads there): give the "
                             "sequences other rows, or a drafter cache with one more row")
        anchors = torch.as_tensor(anchors, dtype=torch.long).cpu().flatten()
        if anchors.numel() != n:
            raise InputError(f"{anchors.numel()} anchors for {n} rows")
        start = rings.pos[rows].clone()                                               # [n]
        key = (max(bucket_for(n), self.min_bucket), params.greedy, trace is not None)
        st = self._buckets.get(key)
        if st is None:
            inputs = DraftInputs(model, key[0], self.scratch_row, rings.window)
            st = self._buckets[key] = _DraftBucket(inputs, TraceBuffers() if trace is not None else None, key[1])
        st.inputs.fill(anchors, start, rows, rings.ring_index(rows))
        self.built = ran_slowly(lambda: self._run(st), self._compiles(st), not st.laid_out)
        if trace is not None:
            st.sink.emit(trace, rows, start.unsqueeze(1) + torch.arange(G), n)        # positions [n, γ]
        inp = st.inputs
        if params.greedy:
            # fresh tensors: on the CPU .cpu() would hand out views of the static buffers the next step rewrites
            return Draft(inp.tokens[:n].clone().cpu(), None, inp.z[:n].float().clone().cpu())
        tokens, q, z = markov_drafts(model.mtp[-1], inp.base[:n], inp.hidden[:n], inp.ids[:n, 0], params, generators)
        return Draft(tokens.cpu(), q, z.float().cpu())

    def _compiles(self, st: _DraftBucket) -> bool:
        """Whether this bucket's drafts run the compiled body (a traced draft runs the eager body)."""
        return self.compiled is not None and st.sink is None

    def _run(self, st: _DraftBucket) -> None:
        def body():
            run = self.compiled if self._compiles(st) else draft_body
            run(self.model, self.rings, st.inputs, st.sink, st.greedy)

        if st.graph is not None:
            st.graph.replay()
            return
        body()
        if not st.laid_out:
            if st.sink is not None:
                st.sink.freeze()
            st.laid_out = True
            if self.capture:
                st.graph = capture_cuda_graph(body, self.warmup, what="draft",
                                              check="engine.graphs.check_draft_capture_safe(args)")
