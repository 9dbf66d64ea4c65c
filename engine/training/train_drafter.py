"""DSpark drafter training on a frozen backbone: block cross-entropy through the Markov head + confidence BCE."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..dspark.teacher_forced import draft_teacher_forced
from ..spec.errors import InputError
from ..text.vocab import ID_MAP_NAME
from .continuations import continuation_windows
from .fields import option
from .loop import TrainingLoop, check_schedule, check_token_ids, parameter_groups
from .windows import train_windows

STATE_FORMAT = "v41viz-train-drafter/1"
LOG_NAME = "drafter_log.csv"
COLUMNS = ("step", "loss", "ce", "distill", "confidence_loss", "predicted_acceptance", "target_acceptance", "lr",
           "step_s", "elapsed_s")


@dataclass(frozen=True)
class DrafterTrainConfig:
    steps: int = option(300, "total optimizer steps")
    batch: int = option(4, "sequences per step")               # every position of each is an anchor
    seq: int = option(128, "tokens per sequence, each an anchor")
    lr: float = option(1e-3, "peak learning rate")
    min_lr: float = option(1e-4, "final learning rate")
    warmup: int = option(20, "warmup steps")
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    confidence_weight: float = option(1.0, "weight of the confidence head's BCE")  # next to the block CE
    # weight of the distillation term: cross-entropy of the draft against the frozen target's own next-token
    # distribution at the same position. Acceptance compares the draft with the target, not with the data,
    # so matching the target's distribution is what raises the accepted length.
    distill_weight: float = option(1.0, "weight of the cross-entropy against the frozen target's next-token "
                                        "distribution, 0 = real tokens only")
    # with a continuations file (engine.training.continuations): the share of each batch cut from the target's
    # continuations instead of the corpus
    continuation_share: float = option(0.75, "with --continuations: the share of each batch taken from them")
    save_every: int = option(100, "checkpoint period")
    seed: int = option(0, "seed of the training windows")

    def __post_init__(self) -> None:
        check_schedule(self, ("steps", "batch", "seq", "save_every"))
        if self.seq < 2:
            raise InputError("DrafterTrainConfig.seq must be at least 2 (an anchor needs features before it)")
        for key in ("confidence_weight", "distill_weight"):
            if getattr(self, key) < 0:
                raise InputError(f"DrafterTrainConfig.{key} must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.continuation_share <= 1:
            raise InputError(f"DrafterTrainConfig.continuation_share must lie in [0, 1], got {self.continuation_share}")


@dataclass
class DrafterLoss:
    loss: torch.Tensor                # ce + distill_weight · distill + confidence_weight · bce (differentiable)
    ce: torch.Tensor                  # block cross-entropy of the Markov-corrected draft logits (real tokens)
    distill: torch.Tensor             # cross-entropy of the draft against the target's distribution
    confidence_loss: torch.Tensor     # BCE of the confidence logits against the analytical acceptance
    predicted: float                  # mean sigmoid(z_k) over valid draft positions
    target: float                     # mean analytical acceptance 1 − ½‖p_draft − p_target‖₁


def freeze_backbone(model) -> tuple[list, list, dict[int, str]]:
    """Only `mtp.*` trains; everything else gets requires_grad False. Returns (decayed, not decayed, id → name)
    for the drafter's parameters (see loop.parameter_groups)."""
    groups = parameter_groups(model, lambda name: name.startswith("mtp."))
    if not groups[2]:
        raise InputError(f"config '{model.args.name}' has no DSpark drafter (no mtp.* parameters) to train")
    return groups


def acceptance_target(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """[...] 1 − ½‖p_draft − p_target‖₁ at temperature 1: the probability that speculative sampling accepts
    a token drawn from the draft (Σ min(p, q) = 1 − TV distance). Both inputs are detached."""
    p_draft = torch.softmax(draft_logits.detach().float(), -1)
    p_target = torch.softmax(target_logits.detach().float(), -1)
    return 1.0 - 0.5 * (p_draft - p_target).abs().sum(-1)


def drafter_loss(model, batch: torch.Tensor, confidence_weight: float, distill_weight: float = 0.0) -> DrafterLoss:
    """batch [B, T] token windows. The frozen backbone runs once without grad for its taps and logits; the
    drafter then runs teacher-forced with every position 1..T−1 of each window as an anchor."""
    B, T = batch.shape
    gamma = model.args.dspark_block_size
    with torch.no_grad():
        target_logits, taps = model(batch.to(model.device), logits="all")  # [B, T, V], [B, T, n·dim]
    anchors = torch.arange(1, T)
    ce_sum, kd_sum, bce_sum, count, pred_sum, tgt_sum = 0.0, 0.0, 0.0, 0, 0.0, 0.0
    for b in range(B):
        out = draft_teacher_forced(model, batch[b], taps[b], anchors)
        valid = (out.targets >= 0).to(out.logits.device)                     # [N, γ]
        # draft k of anchor a predicts position a+1+k, which the backbone predicts from position a+k
        where = (anchors.unsqueeze(1) + torch.arange(gamma)).clamp_max(T - 1).to(target_logits.device)  # [N, γ]
        teacher = target_logits[b][where]                                     # [N, γ, V]
        tgt = acceptance_target(out.logits, teacher)                          # [N, γ]
        logits, targets = out.logits[valid], out.targets.to(valid.device)[valid]
        ce_sum = ce_sum + F.cross_entropy(logits.float(), targets, reduction="sum")
        if distill_weight:
            soft = torch.softmax(teacher[valid].float(), -1)                  # [n_valid, V]
            kd_sum = kd_sum - (soft * torch.log_softmax(logits.float(), -1)).sum()
        z = out.confidence_logits.float()[valid]
        bce_sum = bce_sum + F.binary_cross_entropy_with_logits(z, tgt[valid], reduction="sum")
        count += int(valid.sum())
        pred_sum += float(torch.sigmoid(z.detach()).sum())
        tgt_sum += float(tgt[valid].sum())
    ce, kd, bce = ce_sum / count, torch.as_tensor(kd_sum / count), bce_sum / count
    return DrafterLoss(ce + distill_weight * kd + confidence_weight * bce, ce, kd, bce, pred_sum / count,
                       tgt_sum / count)


class DrafterTrainer(TrainingLoop):
    """Trains model.mtp on token windows with the rest of `model` frozen (fp32, quant emulation off, eval).
    `out` is the drafter run's directory (not the backbone's): model + AdamW state + drafter_log.csv."""

    STATE_FORMAT = STATE_FORMAT
    RUN_KIND = "drafter"
    LOG_NAME = LOG_NAME
    LOG_COLUMNS = COLUMNS

    def __init__(self, model, cfg: DrafterTrainConfig, data: dict[str, np.ndarray], out: str | Path,
                 id_map_file: Path | None = None, backbone_log: Path | None = None, resume: bool = False,
                 continuations: np.ndarray | None = None, log=print):
        check_token_ids({"train": data["train"]}, model.args.vocab_size,
                        "prepare the data with the id map of this checkpoint")
        self.train_tokens = data["train"]
        self.continuations = continuations                # [n, L] continuations of the target, or None
        self.backbone_log = backbone_log
        model.eval()                                      # the drafter has no dropout; eval freezes nothing else
        super().__init__(model, cfg, out, id_map_file=id_map_file, resume=resume, log=log)

    def parameter_groups(self) -> tuple[list, list, dict[int, str]]:
        return freeze_backbone(self.model)

    def windows(self) -> torch.Tensor:
        """This step's [batch, seq + 1] windows: continuation_share of them from the continuations (when given),
        the rest from the corpus."""
        cfg = self.cfg
        n = round(cfg.batch * cfg.continuation_share) if self.continuations is not None else 0
        parts = [continuation_windows(self.continuations, n, cfg.seq, cfg.seed, self.step)] if n else []
        if cfg.batch > n:
            parts.append(train_windows(self.train_tokens, self.step, cfg)[:cfg.batch - n])
        return torch.cat(parts)

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
        parts = drafter_loss(self.model, batch, self.cfg.confidence_weight, self.cfg.distill_weight)
        return parts.loss, {"loss": float(parts.loss.detach()), "ce": float(parts.ce.detach()),
                            "distill": float(parts.distill.detach()),
                            "confidence_loss": float(parts.confidence_loss.detach()),
                            "predicted_acceptance": parts.predicted, "target_acceptance": parts.target}

    def run_state(self, heldout_loss: float | None) -> dict:
        return {"format": self.STATE_FORMAT, "step": self.step, "elapsed_s": self.elapsed,
                "train_config": asdict(self.cfg), "model": self.model.args.name}

    def metadata(self) -> dict[str, str]:
        return {"drafter_train_step": str(self.step), "id_map": ID_MAP_NAME}

    def restore(self, state: dict) -> str:
        return f"resumed drafter run {self.out} at step {self.step}"

    def progress(self, row: dict) -> tuple[float, float, str]:
        return (row["ce"], self.cfg.batch * self.cfg.seq / row["step_s"],
                f"conf {row['predicted_acceptance']:.2f} vs {row['target_acceptance']:.2f}")

    def exported_logs(self) -> list[Path]:
        """The shipped checkpoint carries the backbone's log.csv (when given) and drafter_log.csv."""
        return [p for p in (self.backbone_log, self.out / LOG_NAME) if p is not None]
