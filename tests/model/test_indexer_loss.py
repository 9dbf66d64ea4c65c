"""Indexer auxiliary loss: only indexer weights get its gradient, training lowers it, inference is unchanged."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model import IndexerLoss
from engine.training.train import TrainConfig, Trainer, build_model
from tests.model_helpers import random_tokens, synthetic_token_map, tiny_args, tiny_model

INDEXER_PARTS = (".indexer.wq_b.", ".indexer.weights_proj.", ".indexer.wk.", ".indexer.k_norm.")


def indexer_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if layer.role.indexer in ("own", "reindex")]


def test_logits_are_bit_identical_with_the_collector_on():
    model = tiny_model(dtype=torch.float32)
    tokens = random_tokens(2, 24, seed=1)
    plain = model(tokens, logits="all").logits
    collector = IndexerLoss()
    with_loss = model(tokens, logits="all", indexer_loss=collector).logits
    assert torch.equal(plain, with_loss)
    assert sorted(collector.per_layer) == indexer_layers(model) and len(collector.per_layer) >= 2
    kl = collector.value()
    assert torch.isfinite(kl) and float(kl.detach()) > 0


def test_cached_decode_is_unchanged_by_the_collector():
    model = tiny_model(dtype=torch.float32)
    tokens = random_tokens(1, 12, seed=2)
    outs = []
    for collector in (None, IndexerLoss()):
        cache = model.new_cache(1, 16)
        first = model(tokens[:, :10], cache, indexer_loss=collector).logits
        outs.append(torch.cat([first, model(tokens[:, 10:11], cache, indexer_loss=collector).logits]))
    assert torch.equal(outs[0], outs[1])


@pytest.fixture
def train_model():
    args = tiny_args(vocab_size=512, dspark_noise_token_id=500)
    return build_model(args, synthetic_token_map(args), seed=0)


def test_only_indexer_weights_receive_its_gradient(train_model):
    model = train_model
    tokens = random_tokens(2, 24, seed=3, vocab=512)
    collector = IndexerLoss()
    model(tokens, logits="all", indexer_loss=collector)
    collector.value().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    indexer = {n: g for n, g in grads.items() if any(part in f".{n}" for part in INDEXER_PARTS)}
    assert any(".wk." in n for n in indexer) and any(".weights_proj." in n for n in indexer)
    for name, g in indexer.items():
        assert g is not None and float(g.abs().sum()) > 0, name
    others = [n for n, g in grads.items() if n not in indexer and g is not None and float(g.abs().sum()) > 0]
    assert others == []  # inputs detached: the main attention, compressor and embeddings feel nothing


def test_lm_loss_alone_gives_the_indexer_no_gradient(train_model):
    model = train_model
    tokens = random_tokens(2, 25, seed=4, vocab=512)
    logits = model(tokens[:, :-1], logits="all").logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for name, p in model.named_parameters():
        if any(part in f".{name}" for part in INDEXER_PARTS):
            assert p.grad is None or float(p.grad.abs().sum()) == 0, name
    assert float(model.layers[2].attn.wq_a.weight.grad.abs().sum()) > 0   # while the attention does learn


@pytest.mark.slow  # training steps with the KL collector [13 s]
def test_training_steps_reduce_the_indexer_kl(tmp_path):
    args = tiny_args(vocab_size=512, dspark_noise_token_id=500)
    rng = np.random.default_rng(0)
    phrase = rng.integers(3, 512, 40)
    stream = np.concatenate([phrase] * 20).astype(np.int32)
    cfg = TrainConfig(steps=12, batch=2, seq=32, lr=1e-2, min_lr=1e-3, warmup=2, eval_every=12, eval_windows=1,
                      save_every=12, seed=1, indexer_loss=1.0)
    trainer = Trainer(args, cfg, {"train": stream, "heldout": stream[:200]}, tmp_path / "run",
                      engram_map=synthetic_token_map(args), log=lambda *_: None)
    probe = torch.from_numpy(stream[:33].astype(np.int64))[None]

    def probe_kl() -> float:
        collector = IndexerLoss()
        with torch.no_grad():
            trainer.model(probe[:, :-1], logits="all", indexer_loss=collector)
        return float(collector.value())

    before = probe_kl()
    wk_before = trainer.model.layers[2].attn.indexer.wk.weight.detach().clone()
    rows = trainer.run(progress=False)
    after = probe_kl()
    assert after < 0.7 * before, (before, after)
    assert all(np.isfinite(r["indexer_kl"]) for r in rows)
    assert not torch.equal(wk_before, trainer.model.layers[2].attn.indexer.wk.weight)
    assert "indexer_kl" in (tmp_path / "run" / "log.csv").read_text().splitlines()[0]


def test_indexer_loss_off_leaves_the_indexer_untouched(tmp_path):
    args = tiny_args(vocab_size=512, dspark_noise_token_id=500)
    stream = np.random.default_rng(1).integers(3, 512, 400).astype(np.int32)
    cfg = TrainConfig(steps=2, batch=2, seq=16, warmup=1, eval_every=2, eval_windows=1, save_every=2, indexer_loss=0.0)
    trainer = Trainer(args, cfg, {"train": stream, "heldout": stream[:100]}, tmp_path / "run",
                      engram_map=synthetic_token_map(args), log=lambda *_: None)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".indexer." in n}
    rows = trainer.run(progress=False)
    assert all(np.isnan(r["indexer_kl"]) for r in rows)
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if ".indexer." in n)
    with pytest.raises(ValueError, match="indexer_loss must be >= 0"):
        TrainConfig(indexer_loss=-1.0)
