"""DSpark drafter training: CE falls, backbone untouched, confidence tracks the acceptance target, acceptance rises."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.checkpoint.store import load_checkpoint
from engine.cli import build_parser
from engine.generation.speculative import generate_speculative
from engine.model import EngineOptions
from engine.request import GenerationRequest
from engine.training.train import TrainConfig, Trainer
from engine.training.train_drafter import (
    DrafterTrainConfig,
    DrafterTrainer,
    acceptance_target,
    drafter_loss,
    freeze_backbone,
)
from tests.model_helpers import synthetic_token_map, tiny_args

pytestmark = pytest.mark.slow  # trains and resumes a drafter [8 s]

V = 64
PATTERN = [5, 9, 17, 23, 31, 40, 12]
STREAM = np.asarray(PATTERN * 60, dtype=np.int32)   # a repetitive toy sequence of model ids


def drafter_cfg(**kw) -> DrafterTrainConfig:
    base = dict(steps=10, batch=2, seq=24, lr=3e-3, min_lr=3e-3, warmup=1, save_every=1000, seed=1)
    return DrafterTrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    """A tiny V4.1 backbone that has learnt the repeating pattern (so its greedy continuation is predictable)."""
    out = tmp_path_factory.mktemp("backbone")
    args = tiny_args(vocab_size=V, dspark_noise_token_id=V - 1)
    cfg = TrainConfig(steps=10, batch=2, seq=24, lr=1e-2, min_lr=1e-2, warmup=1, eval_every=1000, save_every=1000,
                      seed=0)
    Trainer(args, cfg, {"train": STREAM, "heldout": STREAM[:100]}, out, engram_map=synthetic_token_map(args),
            log=lambda *a: None).run(progress=False)
    return out


def load_backbone(backbone_dir):
    args = tiny_args(vocab_size=V, dspark_noise_token_id=V - 1)
    _, model = load_checkpoint(backbone_dir, token_map=synthetic_token_map(args), config=args,
                               options=EngineOptions(quant_sim=False, act_quant=False))
    return model.eval()


def mean_accepted_length(model) -> float:
    res = generate_speculative(model, [PATTERN * 2], GenerationRequest.of(30, temperature=0.0))
    assert res.tokens[0][:14] == PATTERN * 2      # the backbone continues the pattern (lossless greedy)
    return res.metrics.mean_accepted_length


@pytest.fixture(scope="module")
def trained(backbone_dir, tmp_path_factory):
    """(model before as a state dict, fixed-batch measurements before/after, acceptance before/after, trainer)."""
    model = load_backbone(backbone_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = torch.from_numpy(STREAM[3:3 + 25].astype(np.int64)).unsqueeze(0)
    with torch.no_grad():
        first = drafter_loss(model, probe, 1.0)
    accept0 = mean_accepted_length(model)
    trainer = DrafterTrainer(model, drafter_cfg(), {"train": STREAM}, tmp_path_factory.mktemp("drafter"),
                             backbone_log=backbone_dir / "log.csv", log=lambda *a: None)
    rows = trainer.run(progress=False)
    with torch.no_grad():
        last = drafter_loss(model, probe, 1.0)
    return dict(before=before, first=first, last=last, rows=rows, accept0=accept0,
                accept1=mean_accepted_length(model), trainer=trainer)


def test_training_lowers_the_block_cross_entropy(trained):
    assert float(trained["last"].ce) < 0.5 * float(trained["first"].ce)
    assert trained["rows"][-1]["ce"] < trained["rows"][0]["ce"]


def test_backbone_weights_are_bit_identical_after_training(trained):
    after = trained["trainer"].model.state_dict()
    backbone = [k for k in after if not k.startswith("mtp.")]
    assert backbone and all(torch.equal(after[k], trained["before"][k]) for k in backbone)
    changed = [k for k in after if k.startswith("mtp.") and not torch.equal(after[k], trained["before"][k])]
    assert any("markov_head" in k for k in changed) and any("confidence_head" in k for k in changed)


def test_confidence_predictions_move_towards_the_analytical_target(trained):
    first, last = trained["first"], trained["last"]
    assert abs(last.predicted - last.target) < 0.5 * abs(first.predicted - first.target)
    assert float(last.confidence_loss) < float(first.confidence_loss)


def test_greedy_acceptance_rises_after_training(trained):
    assert trained["accept1"] > trained["accept0"] + 1.0


def test_log_has_one_row_per_step(trained):
    from engine.training.log import read_log
    rows = read_log(trained["trainer"].out / "drafter_log.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 11))
    assert {"ce", "confidence_loss", "predicted_acceptance", "target_acceptance"} <= set(rows[0])


def test_acceptance_target_is_one_minus_total_variation():
    same = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.allclose(acceptance_target(same, same), torch.ones(1))
    disjoint = acceptance_target(torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 50.0]]))
    assert float(disjoint) < 1e-6
    half = acceptance_target(torch.tensor([[0.0, 0.0]]), torch.tensor([[50.0, 0.0]]))   # ½·(½ + ½) = ½ apart
    assert float(half) == pytest.approx(0.5, abs=1e-6)


def test_resume_replays_an_uninterrupted_run_and_export_merges_the_drafter(backbone_dir, tmp_path):
    straight = load_backbone(backbone_dir)
    DrafterTrainer(straight, drafter_cfg(steps=4), {"train": STREAM}, tmp_path / "a",
                   log=lambda *a: None).run(progress=False)
    half = load_backbone(backbone_dir)
    DrafterTrainer(half, drafter_cfg(steps=4, save_every=2), {"train": STREAM}, tmp_path / "b",
                   log=lambda *a: None).run(steps=2, progress=False)
    resumed = DrafterTrainer(load_backbone(backbone_dir), drafter_cfg(steps=4, save_every=2), {"train": STREAM},
                             tmp_path / "b", resume=True, backbone_log=backbone_dir / "log.csv", log=lambda *a: None)
    assert resumed.step == 2
    resumed.run(progress=False)
    want, got = straight.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(FileExistsError, match="--resume"):
        DrafterTrainer(load_backbone(backbone_dir), drafter_cfg(), {"train": STREAM}, tmp_path / "b")

    resumed.export(tmp_path / "ship")
    shipped_files = {p.name for p in (tmp_path / "ship").iterdir()}
    assert {"model.safetensors", "config.json", "log.csv", "drafter_log.csv"} <= shipped_files
    shipped = load_backbone(tmp_path / "ship").state_dict()
    original = load_backbone(backbone_dir).state_dict()
    for k, v in got.items():      # bf16 export (official F32 tensors stay F32): trained drafter + untouched backbone
        ref = v if k.startswith("mtp.") else original[k]
        assert torch.equal(shipped[k], ref) or torch.equal(shipped[k], ref.to(torch.bfloat16).to(ref.dtype)), k
    assert any(not torch.equal(shipped[k], original[k]) for k in shipped if k.startswith("mtp."))

def test_bad_input_is_refused(backbone_dir, tmp_path):
    model = load_backbone(backbone_dir)
    with pytest.raises(ValueError, match="vocab_size"):
        DrafterTrainer(model, drafter_cfg(), {"train": np.asarray([1, 2, V + 5] * 20, dtype=np.int32)}, tmp_path)
    with pytest.raises(ValueError, match="confidence_weight"):
        drafter_cfg(confidence_weight=-1)
    assert "train_drafter" in build_parser().format_help()
    assert freeze_backbone(model)[2]                    # names of trained parameters: the drafter's only
    assert all(n.startswith("mtp.") for n in freeze_backbone(model)[2].values())


def test_distillation_term_is_the_cross_entropy_against_the_target_distribution(backbone_dir):
    model = load_backbone(backbone_dir)
    probe = torch.from_numpy(STREAM[3:3 + 13].astype(np.int64)).unsqueeze(0)            # [1, T]
    with torch.no_grad():
        plain = drafter_loss(model, probe, 1.0)
        both = drafter_loss(model, probe, 1.0, distill_weight=0.5)
        target_logits, taps = model(probe, logits="all")                                 # [1, T, V]
    from engine.dspark.teacher_forced import draft_teacher_forced
    T, gamma = probe.size(1), model.args.dspark_block_size
    anchors = torch.arange(1, T)
    with torch.no_grad():
        out = draft_teacher_forced(model, probe[0], taps[0], anchors)
    valid = out.targets >= 0                                                             # [N, γ]
    where = (anchors.unsqueeze(1) + torch.arange(gamma)).clamp_max(T - 1)              # [N, γ]
    soft = torch.softmax(target_logits[0][where][valid], -1)
    want = -(soft * torch.log_softmax(out.logits[valid].float(), -1)).sum(-1).mean()
    assert float(plain.distill) == 0.0
    assert float(both.distill) == pytest.approx(float(want), rel=1e-5)
    assert float(both.loss) == pytest.approx(float(plain.loss) + 0.5 * float(want), rel=1e-5)


def test_init_drafter_takes_only_the_mtp_tensors(trained, backbone_dir, tmp_path):
    from engine.checkpoint.store import load_weights, save_checkpoint
    donor = trained["trainer"].model
    save_checkpoint(donor, tmp_path / "donor", args=donor.args)
    fresh = load_backbone(backbone_dir)
    load_weights(fresh, tmp_path / "donor", prefix="mtp.")
    mine, theirs, untouched = fresh.state_dict(), donor.state_dict(), load_backbone(backbone_dir).state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if k.startswith("mtp."))
    assert all(torch.equal(mine[k], untouched[k]) for k in mine if not k.startswith("mtp."))
    with pytest.raises(Exception, match="no tensors named 'nope\\.\\*'"):
        load_weights(fresh, tmp_path / "donor", prefix="nope.")
