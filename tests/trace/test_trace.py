"""Trace: recording, budgets, rollback, accessors, and exact save/load in JSON, Parquet and safetensors."""
from __future__ import annotations

import math
import zipfile

import numpy as np
import pytest
import torch

from engine.trace import DSparkStep, Trace, TraceBudget, TraceFormatError, load_trace, load_trace_bytes, save_trace

FORMATS = ("t.json", "t.parquet.zip", "t.safetensors")
HEAD = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))  # a stand-in head for the logit lens: 8 -> 50


def readout(x: torch.Tensor) -> torch.Tensor:
    return x.float() @ HEAD.T


def _doubly_stochastic(g: torch.Generator, *lead: int) -> torch.Tensor:
    c = torch.rand(*lead, 4, 4, generator=g) + 0.1
    for _ in range(50):
        c = c / c.sum(-1, keepdim=True)
        c = c / c.sum(-2, keepdim=True)
    return c


def fill(trace: Trace, *, b: int = 2, s: int = 3, start: int = 0, rows=None, layers=("layers.0", "layers.1")):
    """Record one fake forward of [b, s] tokens at positions start.. into `trace`, like the model does."""
    g = torch.Generator().manual_seed(start * 7 + b)
    rows = torch.arange(b) if rows is None else torch.as_tensor(rows)
    positions = torch.arange(start, start + s).expand(b, s)
    for path in layers:
        scores = torch.rand(b, s, 8, generator=g)
        ids = scores.topk(2, -1).indices
        w = scores.gather(-1, ids).to(torch.bfloat16)  # any float dtype is accepted
        trace.record_moe(path, rows, positions, ids, w, scores.gather(-1, ids), torch.rand(b, s, generator=g) > 0.5)
        for site in ("attn", "ffn"):
            trace.record_mhc(path, site, rows, positions, torch.rand(b, s, 4, generator=g),
                             2 * torch.rand(b, s, 4, generator=g), _doubly_stochastic(g, b, s),
                             torch.rand(b, s, generator=g) * 1e-6, torch.rand(b, s, generator=g) * 1e-6)
        trace.record_engram(path, rows, positions, torch.randint(0, 99, (b, s), generator=g),
                            torch.randint(0, 10**6, (b, s, 6), generator=g), torch.rand(b, s, 4, generator=g))
        if trace.wants_attention(f"{path}.attn"):
            trace.record_attention(f"{path}.attn", rows, positions, torch.randint(-1, 9, (b, s, s + 1), generator=g),
                                   torch.rand(b, s, 2, generator=g), torch.rand(b, s, 2, generator=g),
                                   torch.rand(b, s, 2, generator=g))
        if trace.wants_lens(path):
            trace.record_lens(path, rows, positions, torch.randn(b, s, 8, generator=g),
                              torch.rand(b, s, 4, generator=g), torch.rand(b, s, 4, generator=g), readout)
    return trace


def rich_trace() -> Trace:
    t = Trace(TraceBudget(max_tokens=100, attention=True, top_k_logits=3, lens=True),
              meta={"config": "tiny", "prompt": "héllo"})
    fill(t, b=2, s=3)
    fill(t, b=2, s=1, start=3)
    t.record_prompt(0, [5, 6, 7], ["a", "b", " ç"])
    t.record_token(0, 3, 42, "x\n", step=0, step_time_s=0.0125, logits=torch.randn(50))
    t.record_token(1, 3, 43, "", step=0, step_time_s=0.5, logits=torch.randn(50))
    t.record_dspark_step(DSparkStep(row=0, step=0, anchor_pos=3, anchor_token=42, drafted=[1, 2, 3],
                                    draft_probs=[0.5, 0.25, 0.125], confidences=[0.9, 0.8, 0.1, 0.1, 0.1],
                                    survival=[0.9, 0.72, 0.072, 0.0072, 0.00072], verify_len=2, accepted=1,
                                    next_token=9, next_kind="replacement", time_s=0.01))
    t.record_dspark_step(DSparkStep(row=1, step=0, anchor_pos=3, anchor_token=43, drafted=[4],
                                    draft_probs=[0.75], confidences=[0.5] * 5, survival=[0.5] * 5,
                                    verify_len=1, accepted=1, next_token=8, next_kind="bonus", time_s=math.nan))
    t.omitted["moe"] += 3
    return t


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_is_exact(tmp_path, name):
    t = rich_trace()
    save_trace(t, tmp_path / name)
    back = load_trace(tmp_path / name)
    assert back == t
    assert back.summary() == t.summary()
    # equality is not vacuous: one changed gate value breaks it
    assert back.paths("attention") == ["layers.0.attn", "layers.1.attn"]
    widths = {back.fact("attention", "layers.0.attn", 0, p)["topk"].shape for p in range(4)}
    assert widths == {(4,), (2,)}  # index lists of different widths survive the padding
    rec = back.fact("engram", "layers.1", 1, 2)
    rec["gates"][0] += 1e-7
    assert back != t


@pytest.mark.parametrize("name", FORMATS)
def test_empty_trace_round_trips(tmp_path, name):
    t = Trace(TraceBudget(max_tokens=None, layers={3, "mtp.0"}))
    save_trace(t, tmp_path / name)
    assert load_trace(tmp_path / name) == t


@pytest.mark.parametrize("name", FORMATS)
def test_bytes_round_trip_and_name_errors_by_the_given_name(tmp_path, name):
    t = rich_trace()
    data = save_trace(t, tmp_path / name).read_bytes()
    assert load_trace_bytes(f"upload/{name}", data) == t
    with pytest.raises(TraceFormatError, match=f"^upload/{name}: "):
        load_trace_bytes(f"upload/{name}", data[: len(data) // 2])


def test_parquet_tables_are_readable_by_pandas(tmp_path):
    import pandas as pd
    t = rich_trace()
    save_trace(t, tmp_path / "t.parquet.zip")
    with zipfile.ZipFile(tmp_path / "t.parquet.zip") as z:
        moe = pd.read_parquet(z.open("moe.parquet"))
    assert list(moe.columns[:8]) == ["path", "row", "pos", "slot", "expert", "weight", "score", "vision"]
    assert len(moe) == 2 * 4 * 2 * 2  # layers × positions × rows × slots
    first = moe.iloc[0]
    ids = t.fact("moe", first["path"], int(first["row"]), int(first["pos"]))["ids"]
    assert first["expert"] == ids[0]


@pytest.mark.parametrize("name", FORMATS)
def test_corrupt_files_get_clear_errors(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\x00\x01garbage that is no trace")
    with pytest.raises(TraceFormatError, match=name):
        load_trace(path)


def test_foreign_files_are_refused(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(TraceFormatError, match="header"):
        load_trace(tmp_path / "x.json")
    from safetensors.numpy import save_file
    save_file({"embed.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "ckpt.safetensors"))
    with pytest.raises(TraceFormatError, match="no v41viz trace header"):
        load_trace(tmp_path / "ckpt.safetensors")
    with pytest.raises(ValueError, match="unknown trace format"):
        save_trace(rich_trace(), tmp_path / "t.pkl")
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.json")


def test_token_budget_keeps_first_tokens_and_counts_the_rest():
    t = fill(Trace(TraceBudget(max_tokens=4)), b=2, s=3)
    assert t.summary()["token_slots"] == 4
    kept = {(r, p) for _, _, r, p, _ in t.facts("moe")}
    assert kept == {(0, 0), (0, 1), (0, 2), (1, 0)}
    # 2 of 6 tokens refused in each of 2 layers; mHC has two sites per layer
    assert t.omitted == {"moe": 4, "mhc": 8, "engram": 4}


def test_layer_budget_and_attention_opt_in():
    t = fill(Trace(TraceBudget(layers={1}, attention={"layers.1"})), layers=("layers.0", "layers.1"))
    assert t.paths("moe") == ["layers.1"] and t.paths("attention") == ["layers.1.attn"]
    assert t.omitted["moe"] == 6 and t.omitted["engram"] == 6
    assert not t.wants_attention("layers.0.attn") and t.wants_attention("layers.1.attn")
    # a module path belongs to its layer: the layer budget covers 'layers.1.ffn', not 'layers.10.ffn'
    assert t.budget.keeps_layer("layers.1.ffn") and not t.budget.keeps_layer("layers.10.ffn")
    t2 = fill(Trace(TraceBudget()))
    assert t2.paths("attention") == [] and not t2.wants_attention("layers.0")


def test_rollback_drops_positions_at_and_after_pos_for_that_row_only():
    t = rich_trace()
    before = t.summary()["token_slots"]
    t.rollback(0, 2)
    assert {p for _, _, r, p, _ in t.facts("mhc") if r == 0} == {0, 1}
    assert {p for _, _, r, p, _ in t.facts("mhc") if r == 1} == {0, 1, 2, 3}
    assert [tok.pos for tok in t.tokens(0)] == [0, 1]
    assert [s.row for s in t.dspark_steps] == [1]
    assert t.summary()["token_slots"] == before - 2
    # freed slots are reusable, and re-recording a position replaces its facts
    fill(t, b=1, s=1, start=2, rows=[0])
    assert t.fact("moe", "layers.0", 0, 2) is not None


def test_moe_table_and_expert_load():
    t = fill(Trace(), b=2, s=3)
    table = t.moe_table()
    assert set(table) >= {"path", "row", "pos", "slot", "expert", "weight", "score", "vision"}
    n = len(table["expert"])
    assert n == 2 * 6 * 2 and all(len(v) == n for v in table.values())
    load = t.expert_load("layers.0", n_experts=8)
    mask = table["path"] == "layers.0"
    assert load.sum() == mask.sum() and np.array_equal(load, np.bincount(table["expert"][mask], minlength=8))


def test_mhc_matrix_and_composite_product():
    t = fill(Trace(), b=1, s=2, layers=("layers.0", "layers.1", "layers.2"))
    m = t.mhc_matrix("layers.1", "ffn", 0, 1)
    assert m.shape == (4, 4) and m.dtype == np.float32
    product, gain = t.mhc_composite(0, 1)
    seams = [t.mhc_matrix(f"layers.{i}", s, 0, 1).astype(np.float64) for i in range(3) for s in ("attn", "ffn")]
    expected = np.linalg.multi_dot(seams)
    np.testing.assert_allclose(product, expected, rtol=1e-12)
    assert abs(gain - 1.0) < 1e-5  # products of doubly stochastic matrices stay doubly stochastic
    partial, _ = t.mhc_composite(0, 1, upto="layers.0")
    np.testing.assert_allclose(partial, seams[0] @ seams[1], rtol=1e-12)
    with pytest.raises(KeyError, match="no mHC"):
        t.mhc_matrix("layers.9", "attn", 0, 0)


def test_tokens_accessor_and_top_k():
    t = rich_trace()
    toks = t.tokens(0)
    assert [x.token_id for x in toks] == [5, 6, 7, 42] and [x.generated for x in toks] == [False] * 3 + [True]
    gen = toks[-1]
    assert gen.top_ids.shape == (3,) and np.all(np.diff(gen.top_logits) <= 0)
    assert np.all((gen.top_probs > 0) & (gen.top_probs < 1))


def test_recorded_arrays_are_copies_not_views_of_model_buffers():
    t = Trace()
    pre = torch.ones(1, 1, 4)
    t.record_mhc("layers.0", "attn", torch.tensor([0]), torch.tensor([[0]]), pre, pre, torch.eye(4).expand(1, 1, 4, 4),
                 torch.zeros(1, 1), torch.zeros(1, 1))
    pre.mul_(5)
    assert t.fact("mhc", "layers.0", 0, 0, "attn")["pre"].tolist() == [1, 1, 1, 1]


def test_bad_input_is_named():
    t = Trace()
    with pytest.raises(ValueError, match="site"):
        t.record_mhc("layers.0", "mlp", None, torch.zeros(1, 1, dtype=torch.long), *[torch.zeros(1, 1, 4)] * 3,
                     torch.zeros(1, 1), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="'weights' must start with"):
        t.record_moe("layers.0", None, torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 2, dtype=torch.long),
                     torch.zeros(1, 3, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="max_tokens"):
        TraceBudget(max_tokens=-1)
    with pytest.raises(ValueError, match="accepted"):
        DSparkStep(0, 0, 0, 0, [1], [0.5], [0.5], [0.5], verify_len=1, accepted=2, next_token=0,
                   next_kind="bonus", time_s=0.0)


def test_lens_read_outs_resolve_through_the_head_when_read():
    """The model records each layer's read-out; the first read turns them into top-k, the next token's rank and
    probability (one batched head matmul), and rollback drops them like any other fact."""
    t = rich_trace()
    hidden = torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(9))   # two rows at position 4
    t.record_lens("layers.1", torch.tensor([0, 1]), torch.tensor([[4], [4]]), hidden, torch.ones(2, 1, 4),
                  torch.ones(2, 1, 4), readout)
    t.record_token(0, 5, 7, "z", step=1, step_time_s=0.0, logits=torch.randn(50))
    rec = t.fact("lens", "layers.1", 0, 4)
    probs = torch.softmax(readout(hidden[0, 0]), -1)
    top = torch.topk(probs, 3)
    assert rec["top_ids"].tolist() == top.indices.tolist()
    np.testing.assert_allclose(rec["top_probs"], top.values.numpy(), rtol=1e-6)
    assert rec["next_id"] == 7 and rec["next_rank"] == 1 + int((probs > probs[7]).sum())
    np.testing.assert_allclose(rec["next_prob"], probs[7].item(), rtol=1e-6)
    other = t.fact("lens", "layers.1", 1, 4)
    assert other["next_id"] == -1 and other["next_rank"] == -1 and np.isnan(other["next_prob"])
    assert t.fact("lens", "layers.0", 0, 2)["next_id"] == 42   # the generated token that followed
    assert t.summary()["records"]["lens"] == 2 * 8 + 2 and t._lens_readout is None   # resolved, model let go
    t.rollback(0, 4)
    assert t.fact("lens", "layers.1", 0, 4) is None and t.fact("lens", "layers.1", 1, 4) is not None
