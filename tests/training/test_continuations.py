"""Sequence-level distillation data: the target's greedy or sampled continuations, their file, and drafter training on
them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from engine.cli import build_parser
from engine.generation import Engine, generate
from engine.generation.speculative import generate_speculative
from engine.model import EngineOptions
from engine.request import GenerationRequest
from engine.training.continuations import (
    FILE_FORMAT,
    ContinuationSpec,
    continuation_windows,
    load_continuations,
    make_continuations,
    pool_continuations,
    save_continuations,
)
from engine.training.train_drafter import DrafterTrainConfig, DrafterTrainer, drafter_loss
from tests.model_helpers import tiny_model

pytestmark = pytest.mark.slow  # greedy continuations of training prompts, and drafter training on them [25 s]

V = 64
CORPUS = np.random.default_rng(5).integers(3, V - 1, 600).astype(np.int32)   # model ids below the noise token


def backbone():
    """A random-weight tiny V4.1 (fp32, no quant emulation, as drafter training runs it)."""
    return tiny_model(dtype=torch.float32, vocab_size=V, dspark_noise_token_id=V - 1,
                      options=EngineOptions(quant_sim=False, act_quant=False))


@pytest.fixture(scope="module")
def rows():
    return make_continuations(Engine(backbone()), CORPUS,
                              ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, batch=4))


def test_rows_are_training_prompts_followed_by_the_models_greedy_continuation(rows):
    assert rows.shape == (6, 25) and rows.dtype == np.int32
    text = CORPUS.tobytes()
    model = backbone()
    for row in rows:
        assert row[:5].tobytes() in text                                   # a slice of the training stream
        greedy = generate(model, [row[:5].tolist()], GenerationRequest.of(20, stop_tokens=())).tokens[0]
        assert row[5:].tolist() == greedy                                  # batching changed nothing
    again = make_continuations(Engine(backbone()), CORPUS,
                               ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, batch=4))
    assert np.array_equal(rows, again)
    other = make_continuations(Engine(backbone()), CORPUS,
                               ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, seed=1))
    assert not np.array_equal(rows[:, :5], other[:, :5])


def test_sampled_rows_are_the_models_draws_seeded_per_row_whatever_the_batch(rows):
    spec = ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, batch=4, temperature=1.0)
    sampled = make_continuations(Engine(backbone()), CORPUS, spec)
    assert np.array_equal(sampled[:, :5], rows[:, :5])                      # the same prompts as the greedy rows
    assert not np.array_equal(sampled[:, 5:], rows[:, 5:])                  # but drawn, not the argmax
    regrouped = make_continuations(Engine(backbone()), CORPUS,
                                   ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, batch=2, temperature=1.0))
    assert np.array_equal(sampled, regrouped)
    model = backbone()
    seeds = np.random.default_rng([0, 1]).integers(0, 2**63 - 1, 6)      # the documented rule: per row, from seed
    for row, seed in zip(sampled, seeds.tolist()):
        alone = generate(model, [row[:5].tolist()],
                         GenerationRequest.of(20, stop_tokens=(), temperature=1.0, seed=seed))
        assert row[5:].tolist() == alone.tokens[0]
    other = make_continuations(Engine(backbone()), CORPUS, dataclasses.replace(spec, temperature=0.5))
    assert not np.array_equal(sampled[:, 5:], other[:, 5:])
    for bad in (-1.0, 1e-6, float("nan")):
        with pytest.raises(ValueError, match="continuations: temperature"):
            ContinuationSpec(temperature=bad)


def test_rows_under_a_repetition_penalty_are_the_models_own_under_it(rows):
    """Greedy and sampled continuations under the penalty: each row is what generate gives that prompt (and that
    row's seed) under the same penalty, and the penalty changed the greedy text."""
    model = backbone()
    seeds = np.random.default_rng([0, 1]).integers(0, 2**63 - 1, 6)
    for temperature in (0.0, 1.0):
        spec = ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20, batch=4, temperature=temperature,
                                repetition_penalty=1.4)
        got = make_continuations(Engine(backbone()), CORPUS, spec)
        assert np.array_equal(got[:, :5], rows[:, :5])
        for row, seed in zip(got, seeds.tolist()):
            alone = generate(model, [row[:5].tolist()],
                             GenerationRequest.of(20, stop_tokens=(), temperature=temperature, seed=seed,
                                                  repetition_penalty=1.4))
            assert row[5:].tolist() == alone.tokens[0]
        if temperature == 0:
            assert not np.array_equal(got[:, 5:], rows[:, 5:])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="continuations: repetition_penalty"):
            ContinuationSpec(repetition_penalty=bad)


def test_files_pool_into_one_table_cut_to_the_shortest_rows(rows, tmp_path):
    short = save_continuations(tmp_path / "s.safetensors", rows[:2, :15], ContinuationSpec(), "ckpt")
    full = save_continuations(tmp_path / "f.safetensors", rows, ContinuationSpec(), "ckpt")
    pooled = pool_continuations([full, short], V, 13)
    assert np.array_equal(pooled, np.concatenate([rows[:, :15], rows[:2, :15]]))
    with pytest.raises(ValueError, match="training windows need 16"):
        pool_continuations([full, short], V, 16)                          # the short file names itself


def test_file_round_trip_and_bad_files_are_named(rows, tmp_path):
    spec = ContinuationSpec(sequences=6, prompt_len=5, new_tokens=20)
    path = save_continuations(tmp_path / "c.safetensors", rows, spec, "ckpt")
    assert np.array_equal(load_continuations(path, V, 25), rows)
    with pytest.raises(ValueError, match="training windows need 26"):
        load_continuations(path, V, 26)
    with pytest.raises(ValueError, match="outside the model's vocab_size 10"):
        load_continuations(path, 10, 5)
    with pytest.raises(FileNotFoundError, match="engine continuations"):
        load_continuations(tmp_path / "missing.safetensors", V, 5)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_continuations(tmp_path / "junk.safetensors", V, 5)
    save_file({"tokens": rows}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match=FILE_FORMAT):
        load_continuations(tmp_path / "plain.safetensors", V, 5)
    with pytest.raises(ValueError, match="sequences must be at least 1"):
        ContinuationSpec(sequences=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        make_continuations(Engine(backbone()), CORPUS, ContinuationSpec(sequences=1, new_tokens=10_000))


def test_windows_are_contiguous_slices_and_a_pure_function_of_the_step(rows):
    w = continuation_windows(rows, 8, 12, seed=3, step=7)
    assert w.shape == (8, 13)
    flat = [r.tolist() for r in rows]
    for win in w.tolist():
        assert any(win == r[o:o + 13] for r in flat for o in range(len(r) - 12))
    assert torch.equal(w, continuation_windows(rows, 8, 12, seed=3, step=7))
    assert not torch.equal(w, continuation_windows(rows, 8, 12, seed=3, step=8))


def test_batches_mix_continuations_and_corpus_by_the_configured_share(rows, tmp_path):
    def first_windows(share, conts):
        cfg = DrafterTrainConfig(steps=1, batch=4, seq=12, continuation_share=share, save_every=100)
        return DrafterTrainer(backbone(), cfg, {"train": CORPUS}, tmp_path / f"{share}-{conts is None}",
                              continuations=conts, log=lambda *a: None).windows()
    text, cont = CORPUS.tolist(), [r.tolist() for r in rows]

    def source(win):
        in_corpus = any(win == text[o:o + 13] for o in range(len(text) - 12))
        in_cont = any(win == r[o:o + 13] for r in cont for o in range(len(r) - 12))
        return "corpus" if in_corpus and not in_cont else "cont" if in_cont and not in_corpus else "both"
    assert [source(w) for w in first_windows(0.75, rows).tolist()] == ["cont"] * 3 + ["corpus"]
    assert [source(w) for w in first_windows(0.75, None).tolist()] == ["corpus"] * 4
    assert [source(w) for w in first_windows(0.0, rows).tolist()] == ["corpus"] * 4
    with pytest.raises(ValueError, match="continuation_share"):
        DrafterTrainConfig(continuation_share=1.5)


def test_training_on_continuations_raises_greedy_acceptance_on_them(rows, tmp_path):
    model = backbone()
    probe = torch.from_numpy(rows[:2].astype(np.int64))
    prompts = [r[:5].tolist() for r in rows]

    def accepted() -> float:
        res = generate_speculative(model, prompts, GenerationRequest.of(20, temperature=0.0))
        return res.metrics.mean_accepted_length

    with torch.no_grad():
        ce0 = float(drafter_loss(model, probe, 1.0).ce)
    accept0 = accepted()
    cfg = DrafterTrainConfig(steps=30, batch=4, seq=20, lr=3e-3, min_lr=3e-3, warmup=1, continuation_share=1.0,
                             save_every=100, seed=0)
    DrafterTrainer(model, cfg, {"train": CORPUS}, tmp_path / "run", continuations=rows,
                   log=lambda *a: None).run(progress=False)
    with torch.no_grad():
        assert float(drafter_loss(model, probe, 1.0).ce) < 0.5 * ce0
    assert accepted() > accept0 + 0.5


def test_cli_writes_a_file_train_drafter_reads(card_inputs, tmp_path, capsys):
    """`continuations` on a tiny trained-format checkpoint and prepared data dir, then
    `train_drafter --continuations`."""
    from engine.cli import main
    from engine.training.corpus import load_tokens
    from engine.training.log import read_log
    ckpt, data = card_inputs[0], card_inputs[1]
    assert "continuations" in build_parser().format_help()
    out = tmp_path / "c.safetensors"
    assert main(["continuations", "--checkpoint", str(ckpt), "--data", str(data), "--out", str(out),
                 "--sequences", "3", "--prompt-len", "4", "--new-tokens", "8", "--batch", "2", "--seed", "5"]) == 0
    assert "3 rows of 12 tokens" in capsys.readouterr().out
    engine = Engine.load(checkpoint=ckpt)
    rows = load_continuations(out, engine.args.vocab_size, 12)
    want = make_continuations(engine, load_tokens(data)["train"],
                              ContinuationSpec(sequences=3, prompt_len=4, new_tokens=8, batch=2, seed=5))
    assert np.array_equal(rows, want)
    sampled = tmp_path / "s.safetensors"
    assert main(["continuations", "--checkpoint", str(ckpt), "--data", str(data), "--out", str(sampled),
                 "--sequences", "2", "--prompt-len", "4", "--new-tokens", "8", "--temperature", "0.8"]) == 0
    assert "2 rows of 12 tokens (4 prompt + 8 sampled at T = 0.8)" in capsys.readouterr().out
    want = make_continuations(engine, load_tokens(data)["train"],
                              ContinuationSpec(sequences=2, prompt_len=4, new_tokens=8, temperature=0.8))
    assert np.array_equal(load_continuations(sampled, engine.args.vocab_size, 12), want)
    run = tmp_path / "run"
    assert main(["train_drafter", "--checkpoint", str(ckpt), "--data", str(data), "--out", str(run),
                 "--continuations", str(out), str(sampled), "--continuation-share", "0.5", "--steps", "2",
                 "--batch", "2", "--seq", "8", "--no-progress"]) == 0
    assert [int(r["step"]) for r in read_log(run / "drafter_log.csv")] == [1, 2]
    assert main(["train_drafter", "--checkpoint", str(ckpt), "--data", str(data), "--out", str(tmp_path / "x"),
                 "--continuations", str(out), "--seq", "12"]) == 2           # rows too short for the windows
    assert "training windows need 13" in capsys.readouterr().err
