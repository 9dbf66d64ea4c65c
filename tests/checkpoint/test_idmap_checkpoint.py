"""Reduced-vocabulary checkpoints: Engine.load finds id_map.json, maps text ↔ model ids, restricts the Engram map."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from engine.checkpoint.store import CheckpointError, save_checkpoint
from engine.cli import main as cli_main
from engine.generation import Engine
from engine.model import Transformer, init_weights
from engine.request import GenerationRequest
from engine.text.engram_map import load_token_map
from engine.text.tokenizer import NOISE_ID, load_tokenizer
from engine.text.vocab import IdMap
from engine.trace import Trace
from tests.model_helpers import tiny_args

TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.\n" * 2
UNSEEN = "Zyxomorphic quasars" + " ünïcödé ✓"   # words the map never saw: they must come back as bytes


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """A random-init tiny V4.1 model over a ~300-id vocabulary, saved with its id_map.json."""
    tok = load_tokenizer()
    id_map = IdMap.from_counts(Counter(tok.encode(TEXT)), tok, min_count=1)
    args = tiny_args(vocab_size=id_map.vocab_size, dspark_noise_token_id=id_map.model_id(NOISE_ID))
    full_map = load_token_map(tok)
    model = Transformer(args, id_map.engram_token_map(full_map))
    init_weights(model, 5)
    ckpt = tmp_path_factory.mktemp("reduced") / "ckpt"
    save_checkpoint(model, ckpt, dtype="bf16")
    id_map.save(ckpt)
    return ckpt, id_map, full_map


@pytest.mark.slow  # tokenizer and model builds [4 s]
def test_engine_round_trips_unknown_words_through_the_id_map(reduced):
    ckpt, id_map, full_map = reduced
    engine = Engine.load(checkpoint=ckpt)
    assert engine.args.vocab_size == id_map.vocab_size < 400
    ids = engine.encode(UNSEEN, add_bos=False)
    assert ids == id_map.encode(UNSEEN) and max(ids) < id_map.vocab_size
    assert set(ids) <= set(id_map.byte_model_ids.tolist()) | set(id_map.encode(" "))  # spelled with bytes
    assert engine.tokenizer.decode(ids) == UNSEEN
    # Engram sees the real tokenizer's compressed ids of the kept tokens, not of model ids read as tokenizer ids
    assert np.array_equal(engine.model.token_map.numpy(), full_map[id_map.ids])

    pieces: list[str] = []
    trace = Trace()
    out = engine.generate_text(UNSEEN, GenerationRequest.of(6, trace=trace), on_text=lambda _r, p: pieces.append(p))
    new = out.result.tokens[0]
    assert len(new) == 6 and all(0 <= t < id_map.vocab_size for t in new)
    base = id_map.tokenizer
    assert out.texts[0] == base.decode(id_map.ids[new].tolist()) == id_map.decode(new)
    assert out.texts[0].startswith("".join(pieces))  # streaming holds back only an unfinished UTF-8 character
    records = trace.tokens(0)
    assert [r.token_id for r in records] == out.prompt_ids[0] + new
    assert [r.text for r in records] == [base.token_text(int(id_map.ids[t]), full=True)
                                         for t in out.prompt_ids[0] + new]


def test_a_known_text_uses_the_kept_tokens(reduced):
    ckpt, id_map, _ = reduced
    engine = Engine.load(checkpoint=ckpt)
    ids = engine.encode("The lazy dog", add_bos=True)
    assert ids[0] == 0 and len(ids) == 1 + len(id_map.tokenizer.encode("The lazy dog"))  # no byte spelling
    assert engine.tokenizer.decode(ids[1:]) == "The lazy dog"


def test_an_id_map_of_another_size_is_refused_naming_both(reduced, tmp_path):
    ckpt, id_map, _ = reduced
    other = tmp_path / "other"
    other.mkdir()
    for name in ("model.safetensors", "config.json"):
        (other / name).write_bytes((ckpt / name).read_bytes())
    tok = id_map.tokenizer
    bigger = IdMap.from_counts(Counter(tok.encode(TEXT + "Entirely different words appear here.")), tok, 1)
    bigger.save(other)
    with pytest.raises(CheckpointError, match=f"{bigger.vocab_size} token ids.*vocab_size {id_map.vocab_size}"):
        Engine.load(checkpoint=other)


@pytest.mark.slow  # the CLI on a new checkpoint [5 s]
def test_generate_command_on_a_reduced_checkpoint(reduced, tmp_path, capsys):
    ckpt, id_map, _ = reduced
    trace_file = tmp_path / "t.json"
    code = cli_main(["generate", "--checkpoint", str(ckpt), "--prompt", UNSEEN, "--max-new-tokens", "4",
                     "--trace", str(trace_file)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    trace = Trace.load(trace_file)
    generated = [r for r in trace.tokens(0) if r.generated]
    assert len(generated) == 4
    text = id_map.decode([r.token_id for r in generated])
    assert stdout.startswith(UNSEEN) and text.startswith(stdout.rstrip("\n")[len(UNSEEN):])
    assert f"checkpoint {ckpt}" in stderr
    assert json.loads((ckpt / "id_map.json").read_text())["vocab_size"] == id_map.vocab_size
