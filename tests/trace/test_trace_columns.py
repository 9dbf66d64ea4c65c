"""Trace storage: the columnar recorder keeps exactly what a token-by-token recorder keeps (budget, replacement,
rollback, ragged fields, reused and mutated position tensors), makes no Python object per token, and stages GPU
records without a sync per call."""
from __future__ import annotations

import gc
from collections import Counter

import numpy as np
import pytest
import torch

from engine.trace import Trace, TraceBudget, path_order
from engine.trace.records import arrays_equal

KINDS = ("moe", "mhc", "engram", "attention")


class TokenByToken:
    """The recording rules written the slow, obvious way: tokens in row-major order, a token slot per new (row, pos)
    while max_tokens lasts, the last record of a (kind, path, site, row, pos) wins, rollback forgets positions."""

    def __init__(self, max_tokens: int | None):
        self.max_tokens = max_tokens
        self.slots: dict[tuple[int, int], dict] = {}
        self.omitted: Counter[str] = Counter()

    def record(self, kind, path, site, rows, positions, values):
        for i, row in enumerate(rows):
            for j, pos in enumerate(positions[i]):
                facts = self.slots.get((row, pos))
                if facts is None:
                    if self.max_tokens is not None and len(self.slots) >= self.max_tokens:
                        self.omitted[kind] += 1
                        continue
                    facts = self.slots[(row, pos)] = {}
                facts[(kind, path, site)] = tuple((v[i][j].float() if v.is_floating_point() else v[i][j]).numpy().copy()
                                                  for v in values)

    def rollback(self, row, pos):
        for key in [k for k in self.slots if k[0] == row and k[1] >= pos]:
            del self.slots[key]

    def facts(self, kind):
        out = [(k[1], k[2], row, pos, values) for (row, pos), f in self.slots.items() for k, values in f.items()
               if k[0] == kind]
        return sorted(out, key=lambda r: (path_order(r[0]), r[1], r[2], r[3]))


def _values(kind: str, g: torch.Generator, b: int, s: int, width: int) -> tuple[torch.Tensor, ...]:
    r = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    if kind == "moe":
        return (torch.randint(0, 16, (b, s, 2), generator=g), r(b, s, 2).to(torch.bfloat16), r(b, s, 2),
                r(b, s) > 0.5)
    if kind == "mhc":
        return r(b, s, 4), r(b, s, 4), r(b, s, 4, 4).transpose(-1, -2), r(b, s), r(b, s)  # a strided field too
    if kind == "engram":
        return torch.randint(0, 99, (b, s), generator=g), torch.randint(0, 10**6, (b, s, 6), generator=g), r(b, s, 4)
    return torch.randint(-1, 50, (b, s, width), generator=g), r(b, s), r(b, s), r(b, s)


def _site(kind: str, path: str) -> str:
    return ("attn" if path.endswith("0") else "ffn") if kind == "mhc" else ""


def _call(trace, kind, path, rows, positions, values):
    if kind == "mhc":
        trace.record_mhc(path, _site(kind, path), rows, positions, *values)
    else:
        getattr(trace, f"record_{kind}")(path, rows, positions, *values)


def _same(trace: Trace, ref: TokenByToken) -> None:
    for kind in KINDS:
        got, want = trace.facts(kind), ref.facts(kind)
        assert [r[:4] for r in got] == [r[:4] for r in want], kind
        for g, w in zip(got, want):
            assert all(arrays_equal(np.asarray(a), b) for a, b in zip(g[4], w[4])), (kind, g[:4])
    assert +trace.omitted == +ref.omitted
    assert trace.summary()["token_slots"] == len(ref.slots)


@pytest.mark.parametrize("seed", range(6))
def test_columns_record_what_a_token_by_token_recorder_records(seed):
    """Random forwards of 1-2 rows and 1-3 tokens (rows repeated, positions repeated or revisited, index lists of
    changing width, a budget that runs out), the layers of a forward sharing one positions tensor that is sometimes
    changed in place between layers, with rollbacks in between: every query agrees with the slow recorder."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    budget = TraceBudget(max_tokens=[None, 9, 25][seed % 3], attention=True)
    trace, ref = Trace(budget), TokenByToken(budget.max_tokens)
    paths = ("layers.0", "layers.1", "mtp.0")
    for _step in range(40):
        b, s = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        rows_list = [int(x) for x in rng.integers(0, 3, b)]
        rows = torch.tensor(rows_list)
        positions = torch.tensor(rng.integers(0, 12, (b, s)))
        for layer in range(int(rng.integers(1, 4))):
            if rng.random() < 0.15:  # the same tensor object, new values: the recorder must see them
                positions.copy_(torch.tensor(rng.integers(0, 12, (b, s))))
            for kind in KINDS:
                path = paths[layer % 3] + (".attn" if kind == "attention" else "")
                values = _values(kind, g, b, s, width=int(rng.integers(0, 5)))
                _call(trace, kind, path, rows, positions, values)
                ref.record(kind, path, _site(kind, path), rows_list, positions.tolist(), values)
        if rng.random() < 0.3:
            row, pos = int(rng.integers(0, 3)), int(rng.integers(0, 12))
            trace.rollback(row, pos)
            ref.rollback(row, pos)
    _same(trace, ref)
    tables, header = trace.to_tables()
    assert Trace.from_tables(tables, header) == trace


def test_decode_steps_grow_the_columns_and_keep_every_value(tmp_path):
    """Hundreds of single-token records (past every capacity doubling) read back exactly, through the queries
    and a file round trip."""
    trace, ref = Trace(TraceBudget(max_tokens=None, attention=True)), TokenByToken(None)
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([0])
    for pos in range(300):
        positions = torch.tensor([[pos]])
        for kind in KINDS:
            path = "layers.0.attn" if kind == "attention" else "layers.0"
            values = _values(kind, g, 1, 1, width=min(pos // 40, 5))  # index lists widen as the context grows
            _call(trace, kind, path, rows, positions, values)
            ref.record(kind, path, _site(kind, path), [0], [[pos]], values)
    _same(trace, ref)
    assert trace.fact("attention", "layers.0.attn", 0, 7)["topk"].shape == (0,)
    assert trace.fact("attention", "layers.0.attn", 0, 299)["topk"].shape == (5,)
    saved = trace.save(tmp_path / "t.safetensors")
    assert Trace.load(saved) == trace


def test_recording_makes_no_python_object_per_token():
    """Decode-style recording (one token per call, four kinds, two layers) adds no garbage-collected object
    per token: the facts live in numpy columns."""
    trace = Trace(TraceBudget(max_tokens=None, attention=True))
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([0])
    values = {kind: _values(kind, g, 1, 1, width=4) for kind in KINDS}

    def steps(first: int, n: int) -> None:
        for pos in range(first, first + n):
            positions = torch.tensor([[pos]])
            for layer in ("layers.0", "layers.1"):
                for kind in KINDS:
                    _call(trace, kind, layer + (".attn" if kind == "attention" else ""), rows, positions,
                          values[kind])

    steps(0, 300)  # every column exists and has grown past 256 entries
    gc.collect()
    before = len(gc.get_objects())
    steps(300, 200)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < 40, f"{grown} more Python objects after 200 traced tokens"
    assert trace.summary()["records"] == {"mhc": 1000, "attention": 1000, "moe": 1000, "engram": 1000}


def test_a_record_replaces_the_same_token_and_views_handed_out_keep_their_values():
    trace = Trace(TraceBudget(max_tokens=None))
    pre = torch.ones(2, 1, 4)
    for pos in range(3):
        trace.record_mhc("layers.0", "attn", torch.tensor([0, 1]), torch.tensor([[pos], [pos]]), pre * pos, pre,
                         torch.eye(4).expand(2, 1, 4, 4), torch.zeros(2, 1), torch.zeros(2, 1))
    kept = trace.fact("mhc", "layers.0", 1, 1, "attn")["pre"]
    trace.rollback(0, 1)  # row 0's entries lie between row 1's: the columns are compacted into new buffers
    assert kept.tolist() == [1, 1, 1, 1]
    twice = torch.stack([pre[0], 7 * pre[0]], 1)  # [1, 2, 4]: position 1 given twice in one call
    trace.record_mhc("layers.0", "attn", torch.tensor([1]), torch.tensor([[1, 1]]), twice, torch.ones(1, 2, 4),
                     torch.eye(4).expand(1, 2, 4, 4), torch.zeros(1, 2), torch.zeros(1, 2))
    assert trace.fact("mhc", "layers.0", 1, 1, "attn")["pre"].tolist() == [7, 7, 7, 7]  # the last record wins
    assert [(r, p) for _, _, r, p, _ in trace.facts("mhc")] == [(0, 0), (1, 0), (1, 1), (1, 2)]
    assert trace.summary()["records"] == {"mhc": 4}


def test_a_field_changing_its_number_of_dimensions_is_named():
    trace = Trace()
    args = (torch.tensor([0]), torch.tensor([[0]]))
    trace.record_engram("layers.0", *args, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 6, dtype=torch.long),
                        torch.zeros(1, 1, 4))
    with pytest.raises(ValueError, match=r"record_engram\(layers.0\): 'row_ids' has shape \(2, 3\)"):
        trace.record_engram("layers.0", args[0], torch.tensor([[1]]), torch.zeros(1, 1, dtype=torch.long),
                            torch.zeros(1, 1, 2, 3, dtype=torch.long), torch.zeros(1, 1, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_records_equal_cpu_records():
    """Records of CUDA tensors are staged (one non-blocking copy each) and read back equal to the same records
    made from CPU tensors, after a rollback too."""
    g = torch.Generator().manual_seed(0)
    cpu, gpu = Trace(TraceBudget(max_tokens=None, attention=True)), Trace(TraceBudget(max_tokens=None, attention=True))
    rows = torch.tensor([0, 1])
    for pos in range(40):
        positions = torch.tensor([[pos], [pos]])
        for kind in KINDS:
            path = "layers.2.attn" if kind == "attention" else "layers.2"
            values = _values(kind, g, 2, 1, width=pos % 4)
            _call(cpu, kind, path, rows, positions, values)
            _call(gpu, kind, path, rows, positions, tuple(v.cuda() for v in values))
        if pos == 30:
            cpu.rollback(1, 25)
            gpu.rollback(1, 25)
    ids, weights, scores, _ = _values("moe", g, 2, 1, 0)  # no vision mask: the trace fills in False
    cpu.record_moe("layers.3.ffn", rows, torch.tensor([[0], [0]]), ids, weights, scores)
    gpu.record_moe("layers.3.ffn", rows, torch.tensor([[0], [0]]), ids.cuda(), weights.cuda(), scores.cuda())
    assert gpu == cpu
    assert gpu.fact("moe", "layers.3.ffn", 1, 0)["vision"] == np.False_


def test_staged_copies_keep_every_field_exact(monkeypatch):
    """The GPU path's byte layout (fields of several dtypes packed into one buffer and viewed back; bf16 as fp32,
    int32 as int64, empty and strided fields, a host value beside them), exercised from CPU tensors."""
    import engine.trace.arrays as arrays
    monkeypatch.setattr(arrays, "on_gpu", lambda t: isinstance(t, torch.Tensor))
    g = torch.Generator().manual_seed(0)
    fields = (torch.randint(-5, 9, (2, 3, 5), generator=g, dtype=torch.int32), torch.rand(2, 3, generator=g).to(
              torch.bfloat16), torch.rand(2, 3, 4, 4, generator=g).transpose(-1, -2), torch.zeros(2, 3, 0),
              torch.rand(2, 3, generator=g) > 0.5, np.ones((2, 3), bool))
    dtypes = ("int64", "float32", "float32", "float32", "bool", "bool")
    got = arrays.StagedCopy(fields, dtypes).arrays()
    for value, dtype, back in zip(fields, dtypes, got):
        want = np.asarray(value.float().numpy() if isinstance(value, torch.Tensor) and value.is_floating_point()
                          else value).astype(dtype)
        assert back.dtype == want.dtype and back.shape == want.shape and np.array_equal(back, want)


class RecordsOnly:
    """A Trace seen only through the reader protocol of the tables (its facts record by record), so that
    build_tables takes its record-by-record path."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.budget, self.meta, self.omitted, self.dspark_steps = trace.budget, trace.meta, trace.omitted, []

    def facts(self, kind):
        return self.trace.facts(kind)

    def rows(self):
        return self.trace.rows()

    def tokens(self, row=0):
        return self.trace.tokens(row)


@pytest.mark.parametrize("seed", range(4))
def test_tables_from_columns_equal_tables_built_record_by_record(seed):
    """The whole-column tables (moe slots expanded, fixed and ragged fields, widths left by rolled-back entries,
    several paths and sites) equal the record-by-record tables column for column: names, order, dtypes, values."""
    from engine.trace.tables import build_tables
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    trace = Trace(TraceBudget(max_tokens=None, attention=True))
    for step in range(30):
        b = int(rng.integers(1, 3))
        rows, positions = torch.arange(b), torch.full((b, 1), step)
        for path in ("layers.0", "layers.1", "mtp.0"):
            for kind in KINDS:
                width = int(rng.integers(0, 6)) if seed % 2 else 3 + (step > 20)
                _call(trace, kind, path + (".attn" if kind == "attention" else ""), rows, positions,
                      _values(kind, g, b, 1, width))
    trace.rollback(0, 21)  # the widest index lists of row 0 go: the rest are narrower than the buffers
    fast, fast_header = build_tables(trace)
    slow, slow_header = build_tables(RecordsOnly(trace))
    assert fast_header == slow_header
    for name in slow:
        assert list(fast[name]) == list(slow[name]), name
        for column, want in slow[name].items():
            got = fast[name][column]
            assert got.dtype == want.dtype and got.shape == want.shape, (name, column)
            assert (got.tolist() == want.tolist()) if want.dtype.kind == "O" else \
                np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), (name, column)


def test_a_refused_call_takes_no_token_slot():
    """A call with a malformed field raises before its tokens are admitted: the budget's slot stays free."""
    trace = Trace(TraceBudget(max_tokens=1))
    rows, positions = torch.tensor([0]), torch.tensor([[3]])
    with pytest.raises(ValueError, match="'weights' must start with"):
        trace.record_moe("layers.0.ffn", rows, positions, torch.zeros(1, 1, 2, dtype=torch.long), torch.zeros(1, 2, 2),
                         torch.zeros(1, 1, 2))
    assert trace.summary()["token_slots"] == 0 and not trace.omitted
    trace.record_moe("layers.0.ffn", rows, torch.tensor([[4]]), torch.ones(1, 1, 2, dtype=torch.long),
                     torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    assert [(r, p) for _, _, r, p, _ in trace.facts("moe")] == [(0, 4)]


def test_a_positions_tensor_changed_in_place_between_layers_is_read_again():
    """The layers of a forward share one positions tensor, and the recorder reuses what it worked out from it; a
    tensor changed in place between two layers must still be read anew (on the one-token decode path too)."""
    trace, rows = Trace(TraceBudget(max_tokens=None)), torch.tensor([0])
    gates = torch.ones(1, 1, 4)

    def engram(layer, positions):
        trace.record_engram(f"layers.{layer}.engram", rows, positions, torch.zeros(1, 1, dtype=torch.long),
                            torch.zeros(1, 1, 6, dtype=torch.long), gates * positions[0, 0])

    first = torch.tensor([[0]])
    engram(0, first)
    engram(1, first)
    positions = torch.tensor([[1]])
    engram(0, positions)
    positions[0, 0] = 2  # in place, before the next layer records
    engram(1, positions)
    assert [(p, pos) for p, _, _, pos, _ in trace.facts("engram")] == \
        [("layers.0.engram", 0), ("layers.0.engram", 1), ("layers.1.engram", 0), ("layers.1.engram", 2)]
    assert trace.fact("engram", "layers.1.engram", 0, 2)["gates"].tolist() == [2, 2, 2, 2]
