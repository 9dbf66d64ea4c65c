"""decode_body, draft_body and the drafter rings' rows through torch.compile (inductor), made once per model."""
from __future__ import annotations

import types
import warnings

import torch

from ..dspark.drafter_cache import tapped_ring_rows
from ..speedups.apply import COMPILED_BODIES
from .decode_body import decode_body
from .draft_body import draft_body

RECOMPILE_LIMIT = 64


def compiled_body(model):
    """decode_body compiled for `model` with static shapes (a static body's widths never depend on a value). Dynamo
    guards its compiled graphs on the shapes of what the body is called with, so one wrapper serves every decoder of
    the model. The indexer's RoPE factors stay complex tensors (the reference's cis), for which inductor calls the
    eager kernels and says so once; that notice is silenced (_prepare_dynamo), as it is expected."""
    return _compiled_for(model, decode_body)


def compiled_draft_body(model):
    """draft_body compiled for `model`, as compiled_body (graphs guarded on shapes and on the greedy flag)."""
    return _compiled_for(model, draft_body)


def compiled_ring_rows(model):
    """tapped_ring_rows compiled for `model`: a verify block's taps into the drafter rings' rows (the DrafterCache's
    block_rows)."""
    return _compiled_for(model, tapped_ring_rows)


def _compiled_for(model, body):
    """`body` through torch.compile for this model alone, made on first use and kept on the model.

    Dynamo checks guards before every call of a compiled function; on a small model most of a decode step's guards
    are on the model's modules and parameters (~1.3 of 1.6 ms a call on the shipped model, against a 4–5 ms step).
    Those are dropped (torch.compiler.skip_guard_on_all_nn_modules_unsafe), which is safe here because each model
    gets its own copy of the body's code object, and dynamo keeps its compiled graphs per code object: no other
    model's call can reach these graphs, and this model's modules, their attributes and its parameters' shapes do
    not change after it is built (weights loaded in place are read afresh on every call, except the experts' fused
    copies, which a GraphedDecoder or GraphedDrafter refreshes when it is built; the transforms of
    engine.speedups.apply that change a module's class drop the model's compiled bodies). The guards on everything
    else — caches, static buffers, their shapes — stay. On a CPU the code that calls a graph's kernels is C++ as well
    (inductor's cpp_wrapper) instead of Python: about a millisecond less a call on the shipped model, for a longer
    first compile."""
    owner, bodies = model.__dict__.get(COMPILED_BODIES, (None, None))
    if owner != id(model):   # none yet, or a deep copy's (copy.deepcopy shares functions: the original's graphs)
        bodies = {}
        model.__dict__[COMPILED_BODIES] = (id(model), bodies)
    fn = bodies.get(body)
    if fn is None:
        _prepare_dynamo()
        own = types.FunctionType(body.__code__.replace(), body.__globals__, body.__name__, body.__defaults__,
                                 body.__closure__)
        own.__doc__, own.__qualname__ = body.__doc__, body.__qualname__
        options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                   "cpp_wrapper": model.device.type == "cpu"}
        fn = bodies[body] = torch.compile(own, dynamic=False, options=options)
    return fn


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far (its own counter; a load from inductor's disk
    cache counts too): a call that raises it compiled, and took longer than its later calls will."""
    # torch._dynamo takes seconds to import: only when compiled bodies are counted
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def ran_slowly(run, compiles: bool, first: bool) -> bool:
    """Run one graphed step (`run()`) and say whether it was slower than the bucket's later steps will be, so that
    a run leaves it out of its timings. A step through a compiled body (`compiles`) was slower only if dynamo
    compiled a graph during it: the graphs are the model's, shared by every decoder and drafter, so a new one's
    first step of a bucket is as fast as any. Otherwise the bucket's `first` step was (a capture, a trace buffers'
    layout)."""
    before = graphs_compiled() if compiles else 0
    run()
    return graphs_compiled() > before if compiles else first


def _prepare_dynamo() -> None:
    """Silences inductor's notice about the complex RoPE factors, and lets dynamo keep more compiled graphs per body
    than its default 8 (past the limit it would run the body eagerly, slowly): a body gets one per batch bucket,
    cache length bucket (engine.graphs.buckets.cache_length_for) and block width."""
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
