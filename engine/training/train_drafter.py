"""DSpark drafter training on a frozen backbone: block cross-entropy through the Markov head + confidence BCE."""
from __future__ import annotations

import csv
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..dspark.teacher_forced import draft_teacher_forced
from .continuations import continuation_windows
from .log import Progress, _fmt, read_log
from .state import STATE_NAME, export_checkpoint, load_training_state, save_training_state
from .train import lr_at, train_windows
from ..text.vocab import ID_MAP_NAME

STATE_FORMAT = "v41viz-train-drafter/1"
LOG_NAME = "drafter_log.csv"
COLUMNS = ("step", "loss", "ce", "distill", "confidence_loss", "predicted_acceptance", "target_acceptance", "lr", "step_s",
           "elapsed_s")


@dataclass(frozen=True)
class DrafterTrainConfig:
    steps: int = 300
    batch: int = 4                    # sequences per step; every position of each is an anchor
    seq: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    confidence_weight: float = 1.0    # weight of the confidence head's BCE next to the block cross-entropy
    # weight of the distillation term: cross-entropy of the draft against the frozen target's own next-token
    # distribution at the same position. Acceptance compares the draft with the target, not with the data,
    # so matching the target's distribution is what raises the accepted length.
    distill_weight: float = 1.0
    # with a continuations file (engine.training.continuations): the share of each batch cut from the target's
    # greedy continuations instead of the corpus
    continuation_share: float = 0.75
    save_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch", "seq", "save_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"DrafterTrainConfig.{key} must be at least 1, got {getattr(self, key)}")
        if self.seq < 2:
            raise ValueError(f"DrafterTrainConfig.seq must be at least 2 (an anchor needs features before it)")
        for key in ("confidence_weight", "distill_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"DrafterTrainConfig.{key} must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr})")
        if not 0 <= self.continuation_share <= 1:
            raise ValueError(f"DrafterTrainConfig.continuation_share must lie in [0, 1], got {self.continuation_share}")


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
    for the drafter's parameters (matrices decay; embeddings, norms, mHC and router biases do not)."""
    decay, no_decay, names = [], [], {}
    for name, p in model.named_parameters():
        trainable = name.startswith("mtp.") and not name.endswith(("gate.bias", "gate.bias_vl"))
        p.requires_grad_(trainable)
        if not trainable:
            continue
        names[id(p)] = name
        is_matrix = p.dim() == 2 and "embed" not in name and ".hc_" not in f".{name}"
        (decay if is_matrix else no_decay).append(p)
    if not names:
        raise ValueError(f"config '{model.args.name}' has no DSpark drafter (no mtp.* parameters) to train")
    return decay, no_decay, names


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
        target_logits, taps = model(batch.to(model.device), logits="all", return_taps=True)  # [B, T, V], [B, T, n·dim]
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


class DrafterTrainer:
    """Trains model.mtp on token windows with the rest of `model` frozen (fp32, quant emulation off, eval).
    `out` is the drafter run's directory (not the backbone's): model + AdamW state + drafter_log.csv."""

    def __init__(self, model, cfg: DrafterTrainConfig, data: dict[str, np.ndarray], out: str | Path,
                 id_map_file: Path | None = None, backbone_log: Path | None = None, resume: bool = False,
                 continuations: np.ndarray | None = None, log=print):
        self.model, self.cfg, self.out, self.log = model, cfg, Path(out), log
        self.backbone_log = backbone_log
        tokens = data["train"]
        if tokens.size and (tokens.min() < 0 or tokens.max() >= model.args.vocab_size):
            raise ValueError(f"train tokens reach id {int(tokens.max())}, outside the config's vocab_size "
                             f"{model.args.vocab_size}: prepare the data with the id map of this checkpoint")
        self.train_tokens = tokens
        self.continuations = continuations                # [n, L] greedy continuations of the target, or None
        model.eval()                                      # the drafter has no dropout; eval freezes nothing else
        decay, no_decay, self.names = freeze_backbone(model)
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
        self.step, self.elapsed = 0, 0.0
        if resume:
            state = load_training_state(self.out, model, self.optimizer, self.names)
            if state.get("format") != STATE_FORMAT:
                raise ValueError(f"{self.out} holds a '{state.get('format')}' run, not a drafter run ({STATE_FORMAT})")
            self.step, self.elapsed = state["step"], state["elapsed_s"]
            log(f"resumed drafter run {self.out} at step {self.step}")
        elif (self.out / STATE_NAME).exists():
            raise FileExistsError(f"{self.out} already holds a training run; pass --resume or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if id_map_file is not None and id_map_file.is_file() and id_map_file.resolve() != (self.out / ID_MAP_NAME).resolve():
            shutil.copyfile(id_map_file, self.out / ID_MAP_NAME)
        self._start_log(resume)

    def _start_log(self, resume: bool) -> None:
        path = self.out / LOG_NAME
        rows = [r for r in read_log(path) if int(r["step"]) <= self.step] if resume and path.is_file() else []
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, COLUMNS)
            w.writeheader()
            w.writerows(rows)

    def _write_log(self, row: dict) -> None:
        with open(self.out / LOG_NAME, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, COLUMNS).writerow({k: _fmt(row.get(k)) for k in COLUMNS})

    def train_step(self) -> dict:
        cfg, t0 = self.cfg, time.perf_counter()
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.windows()                                               # [B, seq + 1]
        parts = drafter_loss(self.model, batch, cfg.confidence_weight, cfg.distill_weight)
        self.optimizer.zero_grad(set_to_none=True)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], cfg.grad_clip)
        self.optimizer.step()
        self.step += 1
        dt = time.perf_counter() - t0
        self.elapsed += dt
        row = {"step": self.step, "loss": float(parts.loss.detach()), "ce": float(parts.ce.detach()),
               "distill": float(parts.distill.detach()),
               "confidence_loss": float(parts.confidence_loss.detach()), "predicted_acceptance": parts.predicted,
               "target_acceptance": parts.target, "lr": lr, "step_s": dt, "elapsed_s": self.elapsed}
        self._write_log(row)
        return row

    def windows(self) -> torch.Tensor:
        """This step's [batch, seq + 1] windows: continuation_share of them from the continuations (when given),
        the rest from the corpus."""
        cfg = self.cfg
        n = round(cfg.batch * cfg.continuation_share) if self.continuations is not None else 0
        parts = [continuation_windows(self.continuations, n, cfg.seq, cfg.seed, self.step)] if n else []
        if cfg.batch > n:
            parts.append(train_windows(self.train_tokens, self.step, cfg)[:cfg.batch - n])
        return torch.cat(parts)

    def save(self) -> None:
        state = {"format": STATE_FORMAT, "step": self.step, "elapsed_s": self.elapsed,
                 "train_config": asdict(self.cfg), "model": self.model.args.name}
        save_training_state(self.out, self.model, self.optimizer, self.names, state,
                            {"drafter_train_step": str(self.step), "id_map": ID_MAP_NAME})

    def export(self, dest: str | Path) -> Path:
        """The shippable bf16 checkpoint: the frozen backbone with the trained drafter merged in, id_map.json,
        the backbone's log.csv (when given) and drafter_log.csv."""
        dest = Path(dest)
        file = export_checkpoint(self.out, self.model, dest, {"drafter_train_step": str(self.step), "id_map": ID_MAP_NAME})
        for src in (self.backbone_log, self.out / LOG_NAME):
            if src is not None and src.is_file() and src.resolve() != (dest / src.name).resolve():
                shutil.copyfile(src, dest / src.name)
        return file

    def run(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        end = steps or self.cfg.steps
        bar = Progress(end, self.step) if progress else None
        rows = []
        while self.step < end:
            row = self.train_step()
            rows.append(row)
            if bar:
                bar.update(self.step, row["ce"], self.cfg.batch * self.cfg.seq / row["step_s"], f"conf {row['predicted_acceptance']:.2f} "
                           f"vs {row['target_acceptance']:.2f}")
            if self.step % self.cfg.save_every == 0 or self.step == end:
                self.save()
        if bar:
            bar.close()
        return rows
