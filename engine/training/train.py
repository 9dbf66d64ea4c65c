"""The training loop: full-sequence forward of the engine's own Transformer, AdamW, balancing, eval, checkpoints.

Everything runs in fp32 (routers included). CPU bf16 autocast is not offered: the engine's cache writes
refuse bf16 activations into fp32 buffers, and bf16 matmuls were not faster on the 2-core CPU."""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..spec.config import ModelArgs
from ..model.indexer_loss import IndexerLoss
from ..model.init import init_weights
from ..model.options import EngineOptions
from ..model.transformer import Transformer
from .balance import RouterTap, max_violation, sequence_balance_loss, update_biases
from .log import CsvLog, Progress
from .state import STATE_NAME, export_checkpoint, load_training_state, save_training_state
from ..text.vocab import ID_MAP_NAME


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch: int = 8
    seq: int = 256
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Auxiliary-loss-free bias step per update. DeepSeek-V3 uses 1e-3 over a very long run; in a ~1500-step
    # run on default-small, 1e-3 left the max load violation near 1.8 after 230 steps, while 1e-2 brought
    # it to 0.3-0.56 by step 70-100 at about the same held-out loss.
    bias_gamma: float = 1e-2
    seq_aux_alpha: float = 1e-4       # weight of the sequence-wise balance loss (0 = off)
    # Weight of the lightning indexer's KL loss (0 = off; the indexer then never learns: its top-k gives
    # the LM loss no gradient). Its inputs are detached, so only indexer weights feel it and Adam makes
    # their step size nearly independent of the weight; the weight mainly sets its share of the global
    # gradient-clip norm, kept small so it does not shrink the LM's clipped step.
    indexer_loss: float = 0.1
    eval_every: int = 200
    eval_windows: int = 32
    save_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch", "seq", "eval_every", "eval_windows", "save_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"TrainConfig.{key} must be at least 1, got {getattr(self, key)}")
        if self.indexer_loss < 0:
            raise ValueError(f"TrainConfig.indexer_loss must be >= 0, got {self.indexer_loss}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr})")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay from lr to min_lr at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def train_windows(tokens: np.ndarray, step: int, cfg: TrainConfig) -> torch.Tensor:
    """[batch, seq + 1] random windows of the training stream, a pure function of (seed, step): resume
    needs no RNG state and replays exactly the batches an uninterrupted run would see."""
    if tokens.size < cfg.seq + 2:
        raise ValueError(f"the training stream has {tokens.size} tokens; --seq {cfg.seq} needs at least {cfg.seq + 2}")
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, tokens.size - cfg.seq - 1, cfg.batch)
    return torch.from_numpy(np.stack([tokens[s:s + cfg.seq + 1] for s in starts]).astype(np.int64))


def eval_windows(tokens: np.ndarray, cfg: TrainConfig) -> torch.Tensor:
    """[n, seq + 1] non-overlapping held-out windows spread evenly over the stream (fixed for a run)."""
    n_all = (tokens.size - 1) // (cfg.seq + 1)
    if n_all < 1:
        raise ValueError(f"the held-out stream has {tokens.size} tokens; --seq {cfg.seq} needs at least {cfg.seq + 2}")
    picks = np.linspace(0, n_all - 1, min(cfg.eval_windows, n_all)).round().astype(np.int64)
    return torch.from_numpy(np.stack([tokens[i * (cfg.seq + 1):(i + 1) * (cfg.seq + 1)] for i in picks]).astype(np.int64))


def build_model(args: ModelArgs, engram_map: np.ndarray | None, seed: int) -> Transformer:
    """The engine's Transformer, fp32, quant-dequant emulation off (it has no useful gradient)."""
    model = Transformer(args, engram_map, dtype=torch.float32, options=EngineOptions(quant_sim=False, act_quant=False))
    init_weights(model, seed)
    return model


def trained_parameters(model: Transformer) -> tuple[list, list, dict[int, str]]:
    """(decayed, not decayed, id → name). Draft stages are trained separately; router biases move by the
    balancing rule, not by gradients. Matrices decay; embeddings, Engram tables, norms and mHC do not."""
    decay, no_decay, names = [], [], {}
    for name, p in model.named_parameters():
        if name.startswith("mtp.") or name.endswith(("gate.bias", "gate.bias_vl")):
            p.requires_grad_(False)
            continue
        names[id(p)] = name
        is_matrix = p.dim() == 2 and "embed" not in name and ".hc_" not in f".{name}"
        (decay if is_matrix else no_decay).append(p)
    return decay, no_decay, names


class Trainer:
    def __init__(self, args: ModelArgs, cfg: TrainConfig, data: dict[str, np.ndarray], out: str | Path,
                 engram_map: np.ndarray | None = None, id_map_file: Path | None = None, resume: bool = False,
                 log=print):
        self.args, self.cfg, self.out, self.log = args, cfg, Path(out), log
        for part in ("train", "heldout"):
            if data[part].size and (data[part].min() < 0 or data[part].max() >= args.vocab_size):
                raise ValueError(f"{part} tokens reach id {int(data[part].max())}, outside the config's "
                                 f"vocab_size {args.vocab_size}: prepare the data with the id map this config was made for")
        self.train_tokens, self.eval_batch = data["train"], eval_windows(data["heldout"], cfg)
        torch.manual_seed(cfg.seed)
        self.model = build_model(args, engram_map, cfg.seed)
        decay, no_decay, self.names = trained_parameters(self.model)
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
        self.tap = RouterTap(self.model, keep_inputs=cfg.seq_aux_alpha > 0)
        self.step, self.tokens, self.elapsed = 0, 0, 0.0
        if resume:
            state = load_training_state(self.out, self.model, self.optimizer, self.names)
            self.step, self.tokens, self.elapsed = state["step"], state["tokens"], state["elapsed_s"]
            log(f"resumed {self.out} at step {self.step} ({self.tokens:,} tokens)")
        elif (self.out / STATE_NAME).exists():
            raise FileExistsError(f"{self.out} already holds a training run; pass --resume or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if id_map_file is not None and id_map_file.resolve() != (self.out / ID_MAP_NAME).resolve():
            shutil.copyfile(id_map_file, self.out / ID_MAP_NAME)
        self.csv = CsvLog(self.out / "log.csv", self.step if resume else None)

    def train_step(self) -> dict:
        cfg, t0 = self.cfg, time.perf_counter()
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = train_windows(self.train_tokens, self.step, cfg)
        self.tap.reset()
        self.model.train()
        collector = IndexerLoss() if cfg.indexer_loss > 0 else None
        logits = self.model(batch[:, :-1], logits="all", indexer_loss=collector)  # [B, S, V] fp32
        lm_loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss, aux, index_kl = lm_loss, float("nan"), float("nan")
        if collector is not None:
            kl = collector.value()
            loss, index_kl = loss + cfg.indexer_loss * kl, float(kl.detach())
        if cfg.seq_aux_alpha > 0:
            aux_t = sequence_balance_loss(self.tap, cfg.batch)
            loss, aux = loss + cfg.seq_aux_alpha * aux_t, float(aux_t.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], cfg.grad_clip)
        self.optimizer.step()
        loads = update_biases(self.tap, cfg.bias_gamma)
        self.tap.inputs.clear()
        self.step += 1
        n = cfg.batch * cfg.seq
        self.tokens += n
        dt = time.perf_counter() - t0
        self.elapsed += dt
        vio = float(np.mean([max_violation(l) for l in loads.values()]))
        return {"step": self.step, "tokens": self.tokens, "train_loss": float(lm_loss.detach()), "lr": lr, "step_s": dt,
                "tokens_per_s": n / dt, "elapsed_s": self.elapsed, "max_violation": vio, "seq_balance_loss": aux,
                "indexer_kl": index_kl}

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean next-token cross-entropy (nats) over the fixed held-out windows."""
        self.model.eval()
        total, count = 0.0, 0
        for i in range(0, self.eval_batch.size(0), self.cfg.batch):
            b = self.eval_batch[i:i + self.cfg.batch]
            logits = self.model(b[:, :-1], logits="all")
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), b[:, 1:].flatten(), reduction="sum"))
            count += b[:, 1:].numel()
        self.tap.reset()  # evaluation routing does not count towards balancing
        return total / count

    def save(self, heldout_loss: float | None = None) -> None:
        state = {"format": "v41viz-train/1", "step": self.step, "tokens": self.tokens, "elapsed_s": self.elapsed,
                 "heldout_loss": heldout_loss, "train_config": asdict(self.cfg), "model": self.args.name}
        meta = {"train_step": str(self.step), "train_tokens": str(self.tokens), "id_map": ID_MAP_NAME}
        save_training_state(self.out, self.model, self.optimizer, self.names, state, meta)

    def export(self, dest: str | Path) -> Path:
        """Write the bf16 checkpoint an app or CLI loads (see state.export_checkpoint)."""
        meta = {"train_step": str(self.step), "train_tokens": str(self.tokens), "id_map": ID_MAP_NAME}
        return export_checkpoint(self.out, self.model, Path(dest), meta)

    def run(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Train until `steps` (default cfg.steps) total steps; log, evaluate and save on schedule."""
        cfg, end = self.cfg, steps or self.cfg.steps
        bar = Progress(end, self.step) if progress else None
        rows, held = [], None
        while self.step < end:
            row = self.train_step()
            held = None
            if self.step % cfg.eval_every == 0 or self.step == end:
                held = row["heldout_loss"] = self.evaluate()
            self.csv.write(**row)
            rows.append(row)
            if bar:
                bar.update(self.step, row["train_loss"], row["tokens_per_s"],
                           f"held-out {held:.3f}" if held is not None else f"maxvio {row['max_violation']:.2f}")
            if self.step % cfg.save_every == 0 or self.step == end:
                self.save(held)
        if bar:
            bar.close()
        return rows


def describe(trainer: Trainer) -> str:
    n = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    return json.dumps({"trained_params": n, "config": trainer.args.name, **asdict(trainer.cfg)})
