"""Model card: measured on a tiny random-init checkpoint and corpus; its numbers match direct computations."""
from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.cli import main as cli_main
from engine.dspark.metrics import summarize
from engine.generation import Engine
from engine.generation.speculative import generate_speculative
from engine.request import GenerationRequest
from engine.text.tokenizer import load_tokenizer
from engine.text.vocab import IdMap
from engine.training.card import build_card
from engine.training.card_decoding import PROMPTS
from engine.training.card_prompts import heldout_prompts
from engine.training.corpus import MANIFEST_NAME, TOKENS_NAME
from tests.card_helpers import HELD, OPTS, SEQ, TRAIN

# measures a card end to end on a tiny checkpoint and re-measures it [60 s at load average 5]
pytestmark = pytest.mark.slow


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
    prompts = card["heldout_prompts"]["prompts"]
    assert d["prompts"] == prompts and list(d)[-3:] == ["T=0", "T=1", "T=0, options"]
    assert d["T=0"]["outputs_identical"] is True  # greedy DSpark is lossless
    assert d["T=0, options"]["outputs_identical"] is True  # under the decoding options too
    assert (d["T=0, options"]["repetition_penalty"], d["T=0, options"]["no_repeat_ngram"]) == (1.3, 3)
    for k in ("T=0", "T=1", "T=0, options"):
        assert d[k]["mean_accepted_length"] >= 1.0 and d[k]["plain_tokens_per_s"] > 0
    engine = Engine.load(checkpoint=ckpt)
    for key, t, options in (("T=0", 0.0, {}), ("T=1", 1.0, {}),
                            ("T=0, options", 0.0, {"repetition_penalty": 1.3, "no_repeat_ngram": 3})):
        # the accepted lengths are recomputed from fresh seeded runs, one prompt at a time
        request = GenerationRequest.of(OPTS.new_tokens, temperature=t, seed=OPTS.seed, stop_tokens=(), **options)
        runs = [generate_speculative(engine.model, [engine.encode(p)], request) for p in prompts]
        again = summarize([s for r in runs for s in r.steps])
        r = d[key]
        assert r["mean_accepted_length"] == pytest.approx(again.mean_accepted_length)
        assert r["dspark_steps"] == again.steps and r["decoded_tokens"] == len(prompts) * (OPTS.new_tokens - 1)
        assert r["per_position_acceptance"] == pytest.approx(again.conditional_acceptance, nan_ok=True)
        low, high = r["speedup_range"]
        assert 0 < low <= high and d["repeats"] == OPTS.repeats
        assert len(r["per_prompt"]) == len(prompts)
        for run, row, p in zip(runs, r["per_prompt"], prompts):
            plain = engine.generate([engine.encode(p)], request).tokens
            assert row["steps"] == len(run.steps)
            assert row["mean_accepted_length"] == pytest.approx(summarize(run.steps).mean_accepted_length)
            assert row["outputs_identical"] == (plain == run.tokens)
            assert 0 < row["speedup_range"][0] <= row["speedup"] <= row["speedup_range"][1]
        assert r["outputs_identical"] == all(row["outputs_identical"] for row in r["per_prompt"])
    assert card["measured"]["torch"] == torch.__version__ and card["measured"]["threads"] == torch.get_num_threads()
    assert len(card["measured"]["date"]) == 10 and "cores" in card["measured"]["machine"]
    assert [s["prompt"] for s in card["samples"]] == list(PROMPTS)
    again = Engine.load(checkpoint=ckpt).generate_text("ROMEO:",
                                                       GenerationRequest.of(OPTS.new_tokens, seed=OPTS.seed,
                                                                            temperature=OPTS.sample_temperature))
    assert card["samples"][0]["text"] == again.texts[0]  # fixed seed: the sample is reproducible


def test_card_files_carry_the_measured_numbers(card_inputs):
    ckpt, _, _, _, card = card_inputs
    assert json.loads((ckpt / "card.json").read_text()) == json.loads(json.dumps(card))
    md = (ckpt / "MODEL_CARD.md").read_text()
    assert f"{card['heldout']['loss']:.3f}" in md and f"{card['heldout']['unigram_loss']:.3f}" in md
    assert f"{card['model']['bytes_on_disk']:,}" in md and "test text" in md
    assert f"{card['heldout']['bits_per_byte']:.3f}" in md and all(repr(p) in md for p in card["dspark"]["prompts"])
    q = card["text_quality"]["runs"]["options"]
    assert "## Greedy text quality" in md and "| repetition penalty 1.3, no repeated 3-grams | " \
        f"{100 * q['whitespace_share']:.1f}% | {q['longest_whitespace_run_tokens']} / " in md
    assert "| T = 0, repetition penalty 1.3, no repeated 3-grams | " in md
    # each prompt: in the list of held-out prompts, and a row of the DSpark and of the text-quality per-prompt tables
    assert all(md.count(f"`{p!r}`") == 3 and md.count(f"| `{p!r}` | ") == 2 for p in card["dspark"]["prompts"])
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


def test_the_prompts_are_speech_openings_of_the_held_out_works_only(card_inputs):
    ckpt, _, _, held, card = card_inputs
    text = Engine.load(checkpoint=ckpt).tokenizer.decode(held.tolist())
    prompts = card["heldout_prompts"]["prompts"]
    assert prompts == heldout_prompts(text, OPTS.prompts, OPTS.prompt_words)
    assert len(prompts) == OPTS.prompts == 3 and len(set(prompts)) == 3
    for p in prompts:  # a speaker's heading, then the speech's first words: from the held-out text, not the training
        assert p in HELD and p not in TRAIN and p.count("\n") == 1 and len(p.split("\n")[1].split()) == 4
    assert card["text_quality"]["prompts"] == prompts


def test_bits_per_byte_equal_a_direct_computation(card_inputs):
    ckpt, _, _, held, card = card_inputs
    h = card["heldout"]
    tok = Engine.load(checkpoint=ckpt).tokenizer
    n = h["windows"]
    targets = held[:n * (SEQ + 1)].reshape(n, SEQ + 1)[:, 1:]                              # [n, SEQ]
    special = {0, 1}                                                                       # BOS, EOS spell no text
    n_bytes = sum(len(tok.decode([t for t in w.tolist() if t not in special]).encode("utf-8")) for w in targets)
    assert h["bytes"] == n_bytes > h["tokens"]                                            # words are several bytes
    assert h["bits_per_byte"] == pytest.approx(h["loss"] * h["tokens"] / (math.log(2) * n_bytes), rel=1e-12)
    assert h["unigram_bits_per_byte"] == pytest.approx(h["unigram_loss"] * h["tokens"] / (math.log(2) * n_bytes))


def test_text_quality_is_remeasured_from_fresh_greedy_runs(card_inputs):
    ckpt, _, train, _, card = card_inputs
    q = card["text_quality"]
    engine = Engine.load(checkpoint=ckpt)
    tok = engine.tokenizer
    # runs of letters, any script (tests/training/test_text_quality.py pins it down)
    letters = re.compile(r"[^\W\d_]+")
    known = {w.lower() for w in letters.findall(tok.decode(train.tolist()))}
    assert q["new_tokens"] == OPTS.quality_tokens and q["ngram"] == 4 and list(q["runs"]) == ["off", "options"]
    assert (q["runs"]["options"]["repetition_penalty"], q["runs"]["options"]["no_repeat_ngram"]) == (1.3, 3)
    assert (q["runs"]["off"]["repetition_penalty"], q["runs"]["off"]["no_repeat_ngram"]) == (1.0, 0)
    for name, options in (("off", {}), ("options", {"repetition_penalty": 1.3, "no_repeat_ngram": 3})):
        run = q["runs"][name]
        result = engine.generate([engine.encode(p) for p in q["prompts"]],
                                 GenerationRequest.of(OPTS.quality_tokens, **options))
        blank = tokens = words = known_words = 0
        for row, ids in zip(run["per_prompt"], result.tokens):
            assert row["text"] == tok.decode(ids) and row["tokens"] == len(ids) <= OPTS.quality_tokens
            row_blank = sum(tok.token_text(t).isspace() for t in ids)
            grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
            assert row["whitespace_tokens"] == row_blank and row["ngrams"] == len(grams)
            assert row["repeated_ngrams"] == len(grams) - len(set(grams))
            row_words = [w.lower() for w in letters.findall(row["text"])]
            assert row["words"] == len(row_words) and row["known_words"] == sum(w in known for w in row_words)
            blank, tokens, words = blank + row_blank, tokens + len(ids), words + len(row_words)
            known_words += row["known_words"]
            if name == "options":  # no generated token completes a 3-gram seen before (the prompt's included)
                seq = engine.encode(row["prompt"]) + ids
                for j in range(len(seq) - len(ids), len(seq)):
                    assert tuple(seq[j - 2:j + 1]) not in {tuple(seq[i:i + 3]) for i in range(j - 2)}, (j, seq)
        assert run["tokens"] == tokens and run["whitespace_share"] == pytest.approx(blank / tokens)
        assert run["words"] == words and run["known_word_share"] == pytest.approx(known_words / words)
        assert run["fewest_words"] == min(r["words"] for r in run["per_prompt"])
