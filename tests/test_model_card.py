"""Model card: measured on a tiny random-init checkpoint and corpus; its numbers match direct computations."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.cli import main as cli_main
from engine.dspark.metrics import summarize
from engine.generation import Engine
from engine.generation.speculative import generate_speculative
from engine.text.tokenizer import load_tokenizer
from engine.text.vocab import IdMap
from engine.training.card import PROMPTS, build_card
from engine.training.corpus import MANIFEST_NAME, TOKENS_NAME
from tests.card_helpers import OPTS, SEQ


def test_heldout_loss_and_unigram_baseline_equal_direct_computations(card_inputs):
    ckpt, _, train, held, card = card_inputs
    n = (held.size - 1) // (SEQ + 1)
    assert 1 <= n <= OPTS.windows  # every non-overlapping window is used
    windows = torch.from_numpy(held[:n * (SEQ + 1)].reshape(n, SEQ + 1).astype(np.int64))  # [n, SEQ + 1]
    engine = Engine.load(checkpoint=ckpt)
    with torch.no_grad():
        logits = engine.model(windows[:, :-1], logits="all").logits                        # [n, SEQ, V]
    direct = float(F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten()))
    h = card["heldout"]
    assert h["tokens"] == n * SEQ and h["windows"] == n
    assert h["loss"] == pytest.approx(direct, rel=1e-5)
    assert h["perplexity"] == pytest.approx(math.exp(direct), rel=1e-5)
    counts, V = Counter(train.tolist()), engine.args.vocab_size
    total = train.size + V
    uni = -np.mean([math.log((counts[t] + 1) / total) for t in windows[:, 1:].flatten().tolist()])
    assert h["unigram_loss"] == pytest.approx(uni, rel=1e-9)


def test_balance_engram_dspark_and_samples_are_measured(card_inputs):
    ckpt, _, _, held, card = card_inputs
    args = Engine.load(checkpoint=ckpt).args
    routed = card["heldout"]["tokens"] * args.n_activated_experts
    layers = card["expert_balance"]["layers"]
    assert layers and all(r["tokens_routed"] == routed for r in layers)
    for r in layers:
        assert r["max_violation"] == pytest.approx(r["max_load"] / (routed / args.n_routed_experts) - 1)
    assert card["expert_balance"]["max_violation"] == max(r["max_violation"] for r in layers)
    assert card["expert_balance"]["train_max_violation"] == max(r["train_max_violation"] for r in layers) >= 0
    e = card["engram"]
    assert len(e["layers"]) == len(args.engram_layer_ids)
    for r in e["layers"]:
        assert r["positions"] == card["heldout"]["tokens"]
        assert r["p5"] <= r["p25"] <= r["p50"] <= r["p75"] <= r["p95"]
        assert len(r["per_stream_mean"]) == args.hc_mult
    gates = [g["gate"] for g in e["top_ngrams"]]
    assert len(gates) == OPTS.top_ngrams and gates == sorted(gates, reverse=True)
    assert gates[0] >= max(r["mean"] for r in e["layers"])  # the best position beats its layer's average
    full_text = Engine.load(checkpoint=ckpt).tokenizer.decode(held.tolist())
    assert all(g["ngram"] and g["ngram"] in full_text for g in e["top_ngrams"])  # n-grams of the held-out text
    d = card["dspark"]
    assert d["T=0"]["outputs_identical"] is True  # greedy DSpark is lossless
    for k in ("T=0", "T=1"):
        assert d[k]["mean_accepted_length"] >= 1.0 and d[k]["plain_tokens_per_s"] > 0
    engine = Engine.load(checkpoint=ckpt)
    for t in (0.0, 1.0):  # the accepted length is recomputed from fresh seeded runs, one prompt at a time
        steps = [s for p in PROMPTS for s in generate_speculative(
            engine.model, [engine.encode(p)], max_new_tokens=OPTS.new_tokens, temperature=t, seed=OPTS.seed,
            stop_tokens=()).steps]
        again = summarize(steps)
        r = d[f"T={t:g}"]
        assert r["mean_accepted_length"] == pytest.approx(again.mean_accepted_length)
        assert r["dspark_steps"] == again.steps and r["decoded_tokens"] == len(PROMPTS) * (OPTS.new_tokens - 1)
        assert r["per_position_acceptance"] == pytest.approx(again.conditional_acceptance, nan_ok=True)
        low, high = r["speedup_range"]
        assert 0 < low <= high and d["repeats"] == OPTS.repeats
    assert card["measured"]["torch"] == torch.__version__ and card["measured"]["threads"] == torch.get_num_threads()
    assert len(card["measured"]["date"]) == 10 and "cores" in card["measured"]["machine"]
    assert [s["prompt"] for s in card["samples"]] == list(PROMPTS)
    again = Engine.load(checkpoint=ckpt).generate_text("ROMEO:", max_new_tokens=OPTS.new_tokens, seed=OPTS.seed,
                                                       temperature=OPTS.sample_temperature)
    assert card["samples"][0]["text"] == again.texts[0]  # fixed seed: the sample is reproducible


def test_card_files_carry_the_measured_numbers(card_inputs):
    ckpt, _, _, _, card = card_inputs
    assert json.loads((ckpt / "card.json").read_text()) == json.loads(json.dumps(card))
    md = (ckpt / "MODEL_CARD.md").read_text()
    assert f"{card['heldout']['loss']:.3f}" in md and f"{card['heldout']['unigram_loss']:.3f}" in md
    assert f"{card['model']['bytes_on_disk']:,}" in md and "test text" in md
    assert card["model"]["bytes_on_disk"] == (ckpt / "model.safetensors").stat().st_size
    assert card["training"]["steps"] == 5 and card["training"]["last_logged_heldout_loss"] == pytest.approx(5.5)
    png = (ckpt / "loss_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    img = matplotlib.image.imread(ckpt / "loss_curve.png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_missing_inputs_are_named(card_inputs, tmp_path, capsys):
    ckpt, data, *_ = card_inputs
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / MANIFEST_NAME}, {tmp_path / TOKENS_NAME}$"):
        build_card(ckpt, tmp_path, OPTS)  # a data dir that was never prepared
    assert cli_main(["card", str(tmp_path), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "log.csv" in err


def test_a_tokens_file_that_changed_since_the_manifest_is_refused(card_inputs, tmp_path):
    ckpt, data, *_ = card_inputs
    other = tmp_path / "data"
    other.mkdir()
    (other / TOKENS_NAME).write_bytes((data / TOKENS_NAME).read_bytes() + b" ")
    (other / MANIFEST_NAME).write_text((data / MANIFEST_NAME).read_text())
    with pytest.raises(ValueError, match="differs from the manifest"):
        build_card(ckpt, other, OPTS)


def test_a_corpus_prepared_with_another_id_map_is_refused(card_inputs, tmp_path):
    ckpt, data, *_ = card_inputs
    other = tmp_path / "data"
    other.mkdir()
    for name in (TOKENS_NAME, MANIFEST_NAME):
        (other / name).write_bytes((data / name).read_bytes())
    tok = load_tokenizer()
    IdMap.from_counts(Counter(tok.encode("Another text, another vocabulary.")), tok, 1).save(other)
    with pytest.raises(ValueError, match="differs from the checkpoint's id map"):
        build_card(ckpt, other, OPTS)


def test_drafter_phases_list_every_drafter_log_last_phase_last(tmp_path):
    from engine.training.card import drafter_phases
    header = "step,loss,ce,distill,confidence_loss,predicted_acceptance,target_acceptance,lr,step_s,elapsed_s\n"

    def write(name, ces):
        rows = "".join(f"{i + 1},0,{ce},0,0,0,0,0,1,{(i + 1) * 2.0}\n" for i, ce in enumerate(ces))
        (tmp_path / name).write_text(header + rows, encoding="utf-8")
    write("drafter_log.csv", [9.0] * 5 + [3.0] * 10)
    write("drafter_phase2_log.csv", [4.0, 2.0])
    write("drafter_phase1_log.csv", [6.0])
    got = drafter_phases(tmp_path)
    assert [p["log"] for p in got] == ["drafter_phase1_log.csv", "drafter_phase2_log.csv", "drafter_log.csv"]
    assert [p["steps"] for p in got] == [1, 2, 15]
    assert [p["elapsed_s"] for p in got] == [2.0, 4.0, 30.0]
    assert [p["final_ce_mean_last10"] for p in got] == [6.0, 3.0, 3.0]     # the last ten steps only
    assert drafter_phases(tmp_path / "nothing") == []
