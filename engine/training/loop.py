"""The training loop of both trainers: parameter groups, AdamW, LR schedule, resume, checkpoints, CSV log, progress."""
from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..spec.errors import InputError
from ..text.vocab import ID_MAP_NAME
from .log import CsvLog, progress_bar
from .state import STATE_NAME, export_checkpoint, load_training_state, save_training_state


def check_schedule(cfg, at_least_one: tuple[str, ...]) -> None:
    """Checks every training config shares: the named counts are at least 1, and 0 <= min_lr <= lr."""
    for key in at_least_one:
        if getattr(cfg, key) < 1:
            raise InputError(f"{type(cfg).__name__}.{key} must be at least 1, got {getattr(cfg, key)}")
    if not 0 <= cfg.min_lr <= cfg.lr:
        raise InputError(f"need 0 <= min_lr ({cfg.min_lr}) <= lr ({cfg.lr})")


def lr_at(step: int, cfg) -> float:
    """Linear warmup, then cosine decay from lr to min_lr at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def check_token_ids(streams: dict[str, np.ndarray], vocab_size: int, remedy: str) -> None:
    """ValueError when a token stream holds ids outside [0, vocab_size): the data's id map is another model's."""
    for part, tokens in streams.items():
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
            raise InputError(f"{part} tokens reach id {int(tokens.max())}, outside the config's vocab_size "
                             f"{vocab_size}: {remedy}")


def parameter_groups(model: torch.nn.Module, trains: Callable[[str], bool]) -> tuple[list, list, dict[int, str]]:
    """(decayed, not decayed, id → name) of the parameters whose names `trains` accepts; every other parameter
    gets requires_grad False. Router biases never train: they move by the balancing rule, not by gradients.
    Matrices decay; embeddings, Engram tables, norms and mHC do not."""
    decay, no_decay, names = [], [], {}
    for name, p in model.named_parameters():
        trainable = trains(name) and not name.endswith(("gate.bias", "gate.bias_vl"))
        p.requires_grad_(trainable)
        if not trainable:
            continue
        names[id(p)] = name
        is_matrix = p.dim() == 2 and "embed" not in name and ".hc_" not in f".{name}"
        (decay if is_matrix else no_decay).append(p)
    return decay, no_decay, names


class TrainingLoop:
    """AdamW on the cosine schedule of `cfg`, with exact resume, checkpoints and a CSV log in `out`.

    A trainer says what a step computes and what it records: `parameter_groups`, `windows`, `loss` (and
    optionally `after_update`, `held_out`), `run_state`, `metadata`, `restore`, `progress`. `cfg` needs
    steps, lr, min_lr, warmup, weight_decay, grad_clip and save_every."""

    STATE_FORMAT: str                 # train_state.json "format"
    RUN_KIND: str                     # named when --resume finds another kind of run
    LOG_NAME: str
    LOG_COLUMNS: tuple[str, ...]

    def __init__(self, model: torch.nn.Module, cfg, out: str | Path, id_map_file: Path | None = None,
                 resume: bool = False, log=print):
        self.model, self.cfg, self.out, self.log = model, cfg, Path(out), log
        decay, no_decay, self.names = self.parameter_groups()
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
        self.step, self.elapsed = 0, 0.0
        if resume:
            state = load_training_state(self.out, model, self.optimizer, self.names)
            if state.get("format") != self.STATE_FORMAT:
                raise InputError(f"{self.out} holds a '{state.get('format')}' run, not a {self.RUN_KIND} run "
                                 f"({self.STATE_FORMAT})")
            self.step, self.elapsed = state["step"], state["elapsed_s"]
            log(self.restore(state))
        elif (self.out / STATE_NAME).exists():
            raise FileExistsError(f"{self.out} already holds a training run; pass --resume or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if (id_map_file is not None and id_map_file.is_file()
                and id_map_file.resolve() != (self.out / ID_MAP_NAME).resolve()):
            shutil.copyfile(id_map_file, self.out / ID_MAP_NAME)
        self.csv = CsvLog(self.out / self.LOG_NAME, self.step if resume else None, self.LOG_COLUMNS)

    # ---- what a trainer supplies ------------------------------------------------------------------------
    def parameter_groups(self) -> tuple[list, list, dict[int, str]]:
        """(decayed, not decayed, id → name), e.g. from `parameter_groups(model, trains)`."""
        raise NotImplementedError

    def windows(self) -> torch.Tensor:
        """This step's [batch, seq + 1] token windows."""
        raise NotImplementedError

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The differentiable loss of `batch` and the figures the step logs."""
        raise NotImplementedError

    def after_update(self) -> dict:
        """Work after the optimizer step (e.g. router bias updates); returns more figures to log."""
        return {}

    def held_out(self, end: int) -> float | None:
        """The held-out loss when an evaluation is due after this step, else None."""
        return None

    def run_state(self, heldout_loss: float | None) -> dict:
        """train_state.json (written last by save; its "step" and "elapsed_s" are read back on resume)."""
        raise NotImplementedError

    def metadata(self) -> dict[str, str]:
        """Safetensors metadata of the saved and exported weights."""
        raise NotImplementedError

    def restore(self, state: dict) -> str:
        """Take the trainer's own counters from a resumed train_state.json; returns the line logged."""
        return f"resumed {self.out} at step {self.step}"

    def progress(self, row: dict) -> tuple[float, float, str]:
        """(loss, tokens/s, a note) for the progress bar."""
        raise NotImplementedError

    def exported_logs(self) -> list[Path]:
        """Logs copied beside an exported checkpoint (the run's log.csv and id_map.json always are)."""
        return []

    # ---- the loop ---------------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One AdamW update at this step's learning rate; the logged row."""
        t0 = time.perf_counter()
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, figures = self.loss(self.windows())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                       self.cfg.grad_clip)
        self.optimizer.step()
        figures.update(self.after_update())
        self.step += 1
        dt = time.perf_counter() - t0
        self.elapsed += dt
        return {"step": self.step, **figures, "lr": lr, "step_s": dt, "elapsed_s": self.elapsed}

    def run(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Train until `steps` (default cfg.steps) total steps; log, evaluate and save on schedule."""
        end = steps or self.cfg.steps
        bar = progress_bar(end, self.step) if progress else None
        rows = []
        while self.step < end:
            row = self.train_step()
            held = self.held_out(end)
            if held is not None:
                row["heldout_loss"] = held
            self.csv.write(**row)
            rows.append(row)
            if bar:
                loss, tokens_per_s, note = self.progress(row)
                bar.set_postfix_str(f"loss {loss:.3f} | {tokens_per_s:,.0f} tok/s | {note}", refresh=False)
                bar.update(1)
            if self.step % self.cfg.save_every == 0 or self.step == end:
                self.save(held)
        if bar:
            bar.close()
        return rows

    def save(self, heldout_loss: float | None = None) -> None:
        save_training_state(self.out, self.model, self.optimizer, self.names, self.run_state(heldout_loss),
                            self.metadata())

    def export(self, dest: str | Path) -> Path:
        """Write the shippable bf16 checkpoint (see state.export_checkpoint) and the trainer's logs into `dest`."""
        dest = Path(dest)
        file = export_checkpoint(self.out, self.model, dest, self.metadata())
        for src in self.exported_logs():
            if src.is_file() and src.resolve() != (dest / src.name).resolve():
                shutil.copyfile(src, dest / src.name)
        return file
