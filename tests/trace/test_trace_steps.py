"""The Trace's decode fast path: a step's records kept until the step ends and stacked per kind (StepTable), mHC
residuals derived when read, the lens read out after the last layer. Bit for bit what the per-call path records."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import engine.model.lens_reads as lens_reads
from engine.generation import DSparkConfig, Engine
from engine.model.mhc import stochastic_error
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget

torch.set_num_threads(1)   # small ops on the shared 2-core machine: one thread each (see tests/model_helpers.py)
PROMPT = [0, 17, 4242, 99, 31337, 5]
INSPECT = {"max_tokens": None, "attention": True, "lens": True}   # the Inspect page's budget


class PerCallTrace(Trace):
    """The records as the model made them before the fast path: each seam with its residuals computed at the call
    (engine.model.mhc.stochastic_error), and every call down the checked path (a layer budget naming every layer
    turns the deferral off)."""

    def record_mhc_mix(self, path, site, rows, positions, pre, mix):
        comb = mix[..., :-1].transpose(-1, -2)
        self.record_mhc(path, site, rows, positions, pre, mix[..., -1], comb, *stochastic_error(comb))


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    return {}


def loaded(engines: dict, name: str) -> Engine:
    if name not in engines:
        engines[name] = Engine.load(name)
    return engines[name]


def tables(trace: Trace) -> dict:
    """The trace's tables without the wall times."""
    out = trace.to_tables()[0]
    out["tokens"].pop("step_time_s")
    out["dspark"].pop("time_s")
    return out


def assert_same_tables(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert list(got[name]) == list(want[name]), name
        for column, w in want[name].items():
            g = got[name][column]
            assert g.dtype == w.dtype and g.shape == w.shape, (name, column)
            same = g.tolist() == w.tolist() if w.dtype.kind == "O" else np.array_equal(g, w, equal_nan=True)
            assert same, (name, column)


def per_call_run(engine: Engine, monkeypatch, request: GenerationRequest) -> Trace:
    every_layer = frozenset(f"layers.{i}" for i in range(engine.args.n_layers)) | \
        frozenset(f"mtp.{i}" for i in range(engine.args.n_mtp_layers))
    trace = PerCallTrace(TraceBudget(**INSPECT, layers=every_layer))
    with monkeypatch.context() as m:   # the lens read out layer by layer
        init = lens_reads.LensReads.__init__

        def per_layer(self, *args):
            init(self, *args)
            self.batched = False
        m.setattr(lens_reads.LensReads, "__init__", per_layer)
        engine.generate([PROMPT], replace(request, trace=trace))
    return trace


@pytest.mark.parametrize("name, case, new_tokens", [("tiny-v4.1", "plain", 24),
                                                     ("tiny-v4.1", "dspark", 12), ("tiny-v4.1", "graphed", 12),
                                                     ("tiny-v4", "plain", 12)])
def test_decode_records_equal_the_per_call_path_bit_for_bit(engines, monkeypatch, name, case, new_tokens):
    """Greedy runs long enough for the index lists to widen step by step: the deferred, stacked records, the
    residuals derived when read and the lens read out after the last layer give the tables the per-call path gives:
    V4.1 and V4, and the static decode body's records (graphed: handed over from its trace buffers). DSpark: verify
    blocks and rollbacks between the decode steps."""
    engine = loaded(engines, name)
    request = GenerationRequest.greedy(new_tokens)
    if case == "dspark":
        request = replace(request, dspark=DSparkConfig())
    if case == "graphed":   # on the CPU the static decode body runs eagerly, recording into its buffers
        request = replace(request, cuda_graphs=True)
    fast = Trace(TraceBudget(**INSPECT))
    engine.generate([PROMPT], replace(request, trace=fast))
    slow = per_call_run(engine, monkeypatch, request)
    if case == "dspark":
        assert any(s.accepted < s.verify_len for s in fast.dspark_steps)   # rollbacks happened
    assert fast.summary()["records"] == slow.summary()["records"]
    assert_same_tables(tables(fast), tables(slow))


def test_v4_streams_are_kept_for_the_lens_only_while_small(engines, monkeypatch):
    """A one-token step hands the lens all layers at once (V4: the streams as they are) up to KEPT_STREAM_VALUES per
    layer; past it a V4 step reads out layer by layer while a V4.1 step (which keeps a collapse of dim) still
    batches, and V4's lens records are the same either way."""
    v4, v41 = loaded(engines, "tiny-v4"), loaded(engines, "tiny-v4.1")
    wide = v4.args.hc_mult * v4.args.dim                      # a tiny-v4 layer's streams: 4 × 64 values
    init = lens_reads.LensReads.__init__
    v4_lens = []
    for limit, want in ((wide, {"V4": True, "V4.1": True}), (wide - 1, {"V4": False, "V4.1": True})):
        batched = {}

        def noting(self, model, n_tokens, ctx):
            init(self, model, n_tokens, ctx)
            if n_tokens == 1:   # a decode step
                batched["V4" if model.family.hc_head else "V4.1"] = self.batched
        with monkeypatch.context() as m:
            m.setattr(lens_reads, "KEPT_STREAM_VALUES", limit)
            m.setattr(lens_reads.LensReads, "__init__", noting)
            for engine in (v4, v41):
                trace = Trace(TraceBudget(lens=True))
                engine.generate([PROMPT], GenerationRequest.of(3, trace=trace))
                if engine is v4:
                    v4_lens.append(trace.table("lens"))
        assert batched == want, limit
    assert v4_lens[0].keys() == v4_lens[1].keys()
    assert all(np.array_equal(v4_lens[0][c], v4_lens[1][c]) for c in v4_lens[0])


def _step(trace: Trace, pos: int, widths: dict[str, int], g: torch.Generator) -> None:
    """One decode step's records of a few layers (index lists of the given widths), as the model makes them."""
    rows, positions = torch.tensor([0]), torch.tensor([[pos]])
    for path, width in widths.items():
        trace.record_mhc_mix(path, "attn", rows, positions, torch.rand(1, 1, 4, generator=g),
                             torch.rand(1, 1, 4, 5, generator=g))
        trace.record_attention(f"{path}.attn", rows, positions, torch.randint(-1, 50, (1, 1, width), generator=g),
                               *torch.rand(3, 1, 1, generator=g))
        ids = torch.randint(0, 16, (1, 1, 2), generator=g)
        trace.record_moe(f"{path}.ffn", rows, positions, ids, torch.rand(1, 1, 2, generator=g),
                         torch.rand(1, 1, 2, generator=g))


def test_step_tables_keep_every_record_through_widening_lists_reads_and_rollbacks():
    """Index lists that widen at different steps (a later layer's first, so a row is widened half written), reads
    in the middle of a step and between steps, a rollback and a replaced position: the fast trace equals one fed
    the same records down the checked path, call by call."""
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    fast = Trace(TraceBudget(max_tokens=None, attention=True))
    slow = PerCallTrace(TraceBudget(max_tokens=None, attention=True, layers=frozenset({"layers.0", "layers.1",
                                                                                         "layers.2"})))
    for pos in range(60):
        widths = {"layers.0": 0, "layers.1": pos // 7, "layers.2": pos // 3 + (pos % 11 == 5) * 9}
        for trace, g in ((fast, g1), (slow, g2)):
            _step(trace, pos if pos != 41 else 40, widths, g)   # (position 40 recorded twice: the last wins)
            if pos == 30:
                assert trace.fact("moe", "layers.2.ffn", 0, 30) is not None   # read before the step ended
            if pos == 50:
                trace.rollback(0, 45)
            trace.record_token(0, pos, 1, "", step=pos, step_time_s=0.0)
        if pos in (12, 33):
            assert fast.fact("attention", "layers.2.attn", 0, pos - 1)["topk"].shape == ((pos - 1) // 3,)
    assert fast.summary() == slow.summary()
    assert_same_tables(tables(fast), tables(slow))


def test_mhc_residuals_derived_when_read_have_the_bits_of_each_call():
    """fp32 seams (strided, several rows and tokens) get row_err and col_err when read, equal to
    stochastic_error at the call; a float64 seam's are computed at the call, in float64; the fused seam's form
    unpacks to the same record."""
    g = torch.Generator().manual_seed(0)
    trace = Trace(TraceBudget(max_tokens=None))
    want = {}
    for pos, (b, s) in enumerate([(1, 1), (2, 3), (1, 1), (3, 2)]):
        c = torch.rand(b, s, 4, 4, generator=g, dtype=torch.float64 if pos == 2 else torch.float32)
        for _ in range(20):
            c = c / c.sum(-1, keepdim=True)
            c = c / c.sum(-2, keepdim=True)
        comb = c.transpose(-1, -2).contiguous().transpose(-1, -2)   # a strided view, as the fused seam's
        positions = torch.arange(10 * pos, 10 * pos + s).expand(b, s)
        trace.record_mhc("layers.0", "attn", torch.arange(b), positions, torch.rand(b, s, 4), torch.rand(b, s, 4), comb)
        errs = [e.float().numpy() for e in stochastic_error(comb)]
        for i in range(b):
            for j in range(s):
                want[(i, int(positions[i, j]))] = (errs[0][i, j], errs[1][i, j])
    for (row, pos), (row_err, col_err) in want.items():
        rec = trace.fact("mhc", "layers.0", row, pos, "attn")
        assert rec["row_err"].tobytes() == row_err.tobytes() and rec["col_err"].tobytes() == col_err.tobytes()
    pre, mix = torch.rand(1, 1, 4, generator=g), torch.rand(1, 1, 4, 5, generator=g)
    packed, unpacked = Trace(), Trace()
    packed.record_mhc_mix("layers.1", "ffn", None, torch.tensor([[3]]), pre, mix)
    unpacked.record_mhc("layers.1", "ffn", None, torch.tensor([[3]]), pre, mix[..., -1],
                        mix[..., :-1].transpose(-1, -2))
    assert packed == unpacked
    assert np.array_equal(packed.fact("mhc", "layers.1", 0, 3, "ffn")["comb"], mix[0, 0, :, :-1].T.numpy())


def test_a_step_table_refuses_lists_not_laid_out_as_one_token_lists():
    """The ragged field's lists must each be [1, 1, width]: a list of another rank or batch is refused (the step
    then goes down the checked path, which names the problem) and no row is counted."""
    from engine.trace.step_table import StepTable
    keys = (("attention", "layers.0.attn", ""), ("attention", "layers.1.attn", ""))

    def step(a, b):
        return [(a, torch.rand(1, 1), torch.rand(1, 1), torch.rand(1, 1)),
                (b, torch.rand(1, 1), torch.rand(1, 1), torch.rand(1, 1))]
    first = step(torch.arange(3).view(1, 1, 3), torch.arange(2).view(1, 1, 2))
    table = StepTable(keys, ("int64", "float32", "float32", "float32"), first, ragged=(0,))
    assert table.add(0, 5, keys, first) and table.n == 1
    for a, b in ((torch.zeros(1, 1, 2, 2, dtype=torch.long), torch.zeros(1, 1, 2, 2, dtype=torch.long)),
                 (torch.zeros(2, 1, 4, dtype=torch.long), torch.zeros(2, 1, 1, dtype=torch.long))):
        assert not table.add(0, 6, keys, step(a, b)) and table.n == 1
    assert table.add(0, 6, keys, step(torch.arange(7).view(1, 1, 7), torch.arange(1).view(1, 1, 1)))
    assert table.fields[0].shape[2] >= 7 and table.lengths[0][:2].tolist() == [[3, 2], [7, 1]]
    assert table.fields[0][0, 0, :3].tolist() == [0, 1, 2] and table.fields[0][1, 0, :7].tolist() == list(range(7))
    assert table.fields[0][1, 1, :1].tolist() == [0] and table.fields[0][0, 1, :2].tolist() == [0, 1]
