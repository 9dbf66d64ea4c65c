"""A tiny trained-format checkpoint and prepared data dir, and the model card measured on them (shared fixture)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from engine.checkpoint.store import save_checkpoint
from engine.model import Transformer, init_weights
from engine.text.engram_map import load_token_map
from engine.text.tokenizer import NOISE_ID, load_tokenizer
from engine.text.vocab import IdMap
from engine.training.card import CardOptions, build_card
from engine.training.corpus import MANIFEST_NAME, TOKENS_NAME, sha256_file
from engine.training.log import CsvLog
from tests.model_helpers import tiny_args

TRAIN = "ROMEO: But soft, what light through yonder window breaks?\nJULIET: O Romeo, Romeo.\n" * 3
# held out: speeches as the Gutenberg plays set them (the speaker's heading alone on a line), for the card's prompts
HELD = ("JULIET.\nWherefore art thou Romeo? Deny thy father and refuse thy name.\n\n"
        "ROMEO.\nShall I hear more, or shall I speak at this?\n\n"
        "NURSE.\nMadam, your lady mother craves a word with you.\n\n") * 2
SEQ = 16
OPTS = CardOptions(seq=SEQ, windows=8, batch=2, new_tokens=6, seed=3, top_ngrams=5, repeats=2, prompts=3,
                   quality_tokens=12, repetition_penalty=1.3, no_repeat_ngram=3)


def build_card_inputs(root: Path):
    """A tiny checkpoint (random weights, id map, 5-row log) and a prepared data dir with a manifest under root,
    and the card built from them: (ckpt, data, train tokens, held-out tokens, card)."""
    from safetensors.numpy import save_file
    tok = load_tokenizer()
    id_map = IdMap.from_counts(Counter(tok.encode(TRAIN + HELD)), tok, min_count=1)
    args = tiny_args(vocab_size=id_map.vocab_size, dspark_noise_token_id=id_map.model_id(NOISE_ID))
    model = Transformer(args, id_map.engram_token_map(load_token_map(tok)))
    init_weights(model, 11)
    ckpt, data = root / "ckpt", root / "data"
    save_checkpoint(model, ckpt)
    id_map.save(ckpt)
    log = CsvLog(ckpt / "log.csv")
    for step in range(1, 6):
        log.write(step=step, tokens=step * 32, train_loss=6.0 - step * 0.3, lr=1e-3, tokens_per_s=100.0 + step,
                  step_s=0.3, elapsed_s=0.3 * step, max_violation=1.0 / step,
                  heldout_loss=(6.5 - step * 0.2) if step % 2 == 1 else None)
    data.mkdir()
    train = np.asarray([0, *id_map.encode(TRAIN), 1], dtype=np.int32)
    held = np.asarray([0, *id_map.encode(HELD), 1], dtype=np.int32)
    id_map.save(data)
    save_file({"train": train, "heldout": held}, str(data / TOKENS_NAME))
    manifest = {"sources": [{"package": "test==1", "registry": "none", "file": "inline", "sha256": "0" * 64,
                             "licence": "test text"}],
                "works": {"a": {"split": "train"}, "b": {"split": "heldout"}},
                "tokens": {"train": int(train.size), "heldout": int(held.size)},
                "outputs": {TOKENS_NAME: sha256_file(data / TOKENS_NAME)}}
    (data / MANIFEST_NAME).write_text(json.dumps(manifest))
    card = build_card(ckpt, data, OPTS, log=lambda *_: None)
    return ckpt, data, train, held, card
