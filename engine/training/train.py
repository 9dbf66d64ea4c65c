"""Backbone training: full-sequence forward of the engine's own Transformer, balancing, held-out evaluation.

Everything runs in fp32 (routers included). CPU bf16 autocast is not offered: the engine's cache writes
refuse bf16 activations into fp32 buffers, and bf16 matmuls were not faster on the 2-core CPU (a one-off
observation)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..model.indexer_loss import IndexerLoss
from ..model.init import init_weights
from ..model.options import EngineOptions
from ..model.transformer import Transformer
from ..spec.config import ModelArgs
from ..spec.errors import InputError
from ..speedups import apply_speedups
from ..text.vocab import ID_MAP_NAME
from .balance import RouterTap, max_violation, sequence_balance_loss, update_biases
from .fields import option
from .log import COLUMNS
from .loop import TrainingLoop, check_schedule, check_token_ids, parameter_groups
from .windows import heldout_windows, train_windows


@dataclass(frozen=True)
class TrainConfig:
    steps: int = option(1000, "total optimizer steps")
    batch: int = option(8, "sequences per step")
    seq: int = option(256, "tokens per sequence")
    lr: float = option(3e-3, "peak learning rate")
    min_lr: float = option(3e-4, "final learning rate")
    warmup: int = option(100, "warmup steps")
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Auxiliary-loss-free bias step per update. DeepSeek-V3 uses 1e-3 over a very long run; in a ~1500-step
    # run on default-small (one-off observations), 1e-3 left the max load violation near 1.8 after 230 steps,
    # while 1e-2 brought it to 0.3-0.56 by step 70-100 at about the same held-out loss.
    bias_gamma: float = option(1e-2, "router bias step of the auxiliary-loss-free balancing")
    seq_aux_alpha: float = option(1e-4, "weight of the sequence-wise balance loss, 0 = off", flag="--seq-aux")
    # Weight of the lightning indexer's KL loss (0 = off; the indexer then never learns: its top-k gives
    # the LM loss no gradient). Its inputs are detached, so only indexer weights feel it and Adam makes
    # their step size nearly independent of the weight; the weight mainly sets its share of the global
    # gradient-clip norm, kept small so it does not shrink the LM's clipped step.
    indexer_loss: float = option(0.1, "weight of the lightning indexer's KL loss, 0 = off")
    eval_every: int = option(200, "held-out evaluation period")
    eval_windows: int = option(32, "held-out windows")
    save_every: int = option(200, "checkpoint period")
    seed: int = option(0, "seed of the initial weights and of the training windows")

    def __post_init__(self) -> None:
        check_schedule(self, ("steps", "batch", "seq", "eval_every", "eval_windows", "save_every"))
        if self.indexer_loss < 0:
            raise InputError(f"TrainConfig.indexer_loss must be >= 0, got {self.indexer_loss}")


def build_model(args: ModelArgs, engram_map: np.ndarray | None, seed: int) -> Transformer:
    """The engine's Transformer, fp32, quant-dequant emulation off (it has no useful gradient), with the PyTorch
    speed paths for evaluation (under autograd the reference code runs)."""
    model = Transformer(args, engram_map, dtype=torch.float32, options=EngineOptions(quant_sim=False, act_quant=False))
    init_weights(model, seed)
    return apply_speedups(model)


def trained_parameters(model: Transformer) -> tuple[list, list, dict[int, str]]:
    """(decayed, not decayed, id → name) of everything but the draft stages, which train separately
    (train_drafter); router biases move by the balancing rule (see loop.parameter_groups)."""
    return parameter_groups(model, lambda name: not name.startswith("mtp."))


class Trainer(TrainingLoop):
    """Trains a fresh model of `args` (all but the draft stages) on data["train"]; evaluates on data["heldout"]."""

    STATE_FORMAT = "v41viz-train/1"
    RUN_KIND = "backbone"
    LOG_NAME = "log.csv"
    LOG_COLUMNS = COLUMNS

    def __init__(self, args: ModelArgs, cfg: TrainConfig, data: dict[str, np.ndarray], out: str | Path,
                 engram_map: np.ndarray | None = None, id_map_file: Path | None = None, resume: bool = False,
                 log=print):
        check_token_ids({part: data[part] for part in ("train", "heldout")}, args.vocab_size,
                        "prepare the data with the id map this config was made for")
        self.args, self.train_tokens = args, data["train"]
        self.eval_batch = torch.from_numpy(heldout_windows(data["heldout"], cfg.seq, cfg.eval_windows))  # [n, seq + 1]
        torch.manual_seed(cfg.seed)
        model = build_model(args, engram_map, cfg.seed)
        self.tap = RouterTap(model, keep_inputs=cfg.seq_aux_alpha > 0)
        self.tokens = 0
        super().__init__(model, cfg, out, id_map_file=id_map_file, resume=resume, log=log)

    def parameter_groups(self) -> tuple[list, list, dict[int, str]]:
        return trained_parameters(self.model)

    def windows(self) -> torch.Tensor:
        return train_windows(self.train_tokens, self.step, self.cfg)                     # [B, seq + 1]

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Next-token cross-entropy, plus the indexer KL and the sequence-wise balance loss when weighted."""
        cfg = self.cfg
        self.tap.reset()
        self.model.train()
        collector = IndexerLoss() if cfg.indexer_loss > 0 else None
        logits = self.model(batch[:, :-1], logits="all", indexer_loss=collector).logits  # [B, S, V] fp32
        lm_loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss, aux, index_kl = lm_loss, float("nan"), float("nan")
        if collector is not None:
            kl = collector.value()
            loss, index_kl = loss + cfg.indexer_loss * kl, float(kl.detach())
        if cfg.seq_aux_alpha > 0:
            aux_t = sequence_balance_loss(self.tap, cfg.batch)
            loss, aux = loss + cfg.seq_aux_alpha * aux_t, float(aux_t.detach())
        return loss, {"train_loss": float(lm_loss.detach()), "seq_balance_loss": aux, "indexer_kl": index_kl}

    def after_update(self) -> dict:
        """Move the router biases by this step's expert loads (auxiliary-loss-free balancing)."""
        loads = update_biases(self.tap, self.cfg.bias_gamma)
        self.tap.inputs.clear()
        return {"max_violation": float(np.mean([max_violation(l) for l in loads.values()]))}

    def train_step(self) -> dict:
        row = super().train_step()
        n = self.cfg.batch * self.cfg.seq
        self.tokens += n
        return {**row, "tokens": self.tokens, "tokens_per_s": n / row["step_s"]}

    def held_out(self, end: int) -> float | None:
        return self.evaluate() if self.step % self.cfg.eval_every == 0 or self.step == end else None

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean next-token cross-entropy (nats) over the fixed held-out windows."""
        self.model.eval()
        total, count = 0.0, 0
        for i in range(0, self.eval_batch.size(0), self.cfg.batch):
            b = self.eval_batch[i:i + self.cfg.batch]
            logits = self.model(b[:, :-1], logits="all").logits
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), b[:, 1:].flatten(), reduction="sum"))
            count += b[:, 1:].numel()
        self.tap.reset()  # evaluation routing does not count towards balancing
        return total / count

    def run_state(self, heldout_loss: float | None) -> dict:
        return {"format": self.STATE_FORMAT, "step": self.step, "tokens": self.tokens, "elapsed_s": self.elapsed,
                "heldout_loss": heldout_loss, "train_config": asdict(self.cfg), "model": self.args.name}

    def metadata(self) -> dict[str, str]:
        return {"train_step": str(self.step), "train_tokens": str(self.tokens), "id_map": ID_MAP_NAME}

    def restore(self, state: dict) -> str:
        self.tokens = state["tokens"]
        return f"resumed {self.out} at step {self.step} ({self.tokens:,} tokens)"

    def progress(self, row: dict) -> tuple[float, float, str]:
        held = row.get("heldout_loss")
        return (row["train_loss"], row["tokens_per_s"],
                f"held-out {held:.3f}" if held is not None else f"maxvio {row['max_violation']:.2f}")


def describe(trainer: Trainer) -> str:
    n = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    return json.dumps({"trained_params": n, "config": trainer.args.name, **asdict(trainer.cfg)})
