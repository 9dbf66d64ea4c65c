"""Sequence-level distillation data for the drafter: the frozen target's own continuations of prompts cut from the
training text, greedy or sampled, optionally under a repetition penalty. At T=0 verification accepts a draft exactly
when it equals the target's argmax, so the trajectories the target itself produces are what the drafter must learn
to predict; at T > 0 the drafts are judged along the target's sampled trajectories, which wander into text its
greedy ones never reach, and under a penalty along the text the penalty steers it to."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from ..request import GenerationRequest
from ..request.sampling import MAX_SEED, check_repetition, check_sampling
from ..spec.errors import InputError, MissingFileError

FILE_FORMAT = "v41viz-continuations/1"


@dataclass(frozen=True)
class ContinuationSpec:
    sequences: int = 2048       # how many continuations
    prompt_len: int = 16        # tokens of training text before each
    new_tokens: int = 128       # tokens generated after each prompt
    batch: int = 64             # prompts decoded together
    seed: int = 0               # picks the prompt offsets (and, sampled, seeds the draws)
    temperature: float = 0.0    # 0 = greedy; else sampled at this temperature (no top-k / top-p)
    repetition_penalty: float = 1.0   # 1 = off; else the decoding option of that name (engine.model.sampling)

    def __post_init__(self) -> None:
        for key in ("sequences", "prompt_len", "new_tokens", "batch"):
            if getattr(self, key) < 1:
                raise InputError(f"continuations: {key} must be at least 1, got {getattr(self, key)}")
        check_sampling(self.temperature, 0, 1.0, ("continuations: temperature", "top_k", "top_p"))
        check_repetition(self.repetition_penalty, 0, ("continuations: repetition_penalty", "no_repeat_ngram"))

    @property
    def length(self) -> int:
        return self.prompt_len + self.new_tokens


def make_continuations(engine, train: np.ndarray, spec: ContinuationSpec,
                       progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[sequences, prompt_len + new_tokens] int32: random training-text prompts, each followed by the engine's
    (an engine.generation.Engine) continuation, greedy or sampled at spec.temperature, under
    spec.repetition_penalty (no stop token, so every row has the full length). Deterministic for a fixed spec: each
    row samples with its own seed, drawn from spec.seed, whatever the batch."""
    if train.size < spec.prompt_len + 1:
        raise InputError(f"continuations: the training stream has {train.size} tokens, fewer than a "
                         f"{spec.prompt_len}-token prompt")
    if spec.length > engine.args.max_seq_len:
        raise InputError(f"continuations: prompt_len + new_tokens = {spec.length} exceeds the model's max_seq_len "
                         f"{engine.args.max_seq_len}")
    starts = np.random.default_rng(spec.seed).integers(0, train.size - spec.prompt_len, spec.sequences)
    draw_seeds = np.random.default_rng([spec.seed, 1]).integers(0, MAX_SEED, spec.sequences)   # one per row
    rows = np.empty((spec.sequences, spec.length), dtype=np.int32)
    for first in range(0, spec.sequences, spec.batch):
        chunk = starts[first:first + spec.batch]
        prompts = [train[s:s + spec.prompt_len].tolist() for s in chunk]
        request = GenerationRequest.of(spec.new_tokens, stop_tokens=(), temperature=spec.temperature,
                                       repetition_penalty=spec.repetition_penalty,
                                       seed=draw_seeds[first:first + spec.batch].tolist())
        result = engine.generate(prompts, request)
        for i, (prompt, new) in enumerate(zip(prompts, result.tokens)):
            rows[first + i] = prompt + new
        if progress is not None:
            progress(first + len(chunk), spec.sequences)
    return rows


def save_continuations(path: str | Path, rows: np.ndarray, spec: ContinuationSpec, checkpoint: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": np.ascontiguousarray(rows, dtype=np.int32)}, str(path),
              metadata={"format": FILE_FORMAT, "spec": json.dumps(asdict(spec)), "checkpoint": str(checkpoint)})
    return path


def load_continuations(path: str | Path, vocab_size: int, min_length: int) -> np.ndarray:
    """The [n, L] token rows of a continuations file, checked: the format, a 2-D integer table, rows at least
    min_length long (a training window), ids inside the model's vocabulary."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such continuations file; write one with `python -m engine continuations`")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            rows = f.get_tensor("tokens") if "tokens" in f.keys() else None
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise InputError(f"{path}: not a readable safetensors file ({exc})") from exc
    if meta.get("format") != FILE_FORMAT:
        raise InputError(f"{path}: format {meta.get('format')!r}, expected {FILE_FORMAT!r} (a file written by "
                         "`python -m engine continuations`)")
    if rows is None or rows.ndim != 2 or rows.dtype.kind not in "iu":
        raise InputError(f"{path}: needs a 2-D integer tensor 'tokens'")
    if rows.shape[0] == 0 or rows.shape[1] < min_length:
        raise InputError(f"{path}: rows of {rows.shape[1]} tokens ({rows.shape[0]} rows); training windows need "
                         f"{min_length}")
    if rows.min() < 0 or rows.max() >= vocab_size:
        raise InputError(f"{path}: token ids reach {int(rows.max())}, outside the model's vocab_size {vocab_size}: "
                         "the file was made with another id map")
    return rows


def pool_continuations(paths, vocab_size: int, min_length: int) -> np.ndarray:
    """The rows of several continuations files (load_continuations checks each) as one [n, L] table, every row cut
    to the shortest file's length (a training window is cut from anywhere in a row)."""
    tables = [load_continuations(p, vocab_size, min_length) for p in paths]
    width = min(t.shape[1] for t in tables)
    return np.concatenate([t[:, :width] for t in tables])


def continuation_windows(rows: np.ndarray, count: int, seq: int, seed: int, step: int) -> torch.Tensor:
    """[count, seq + 1] windows cut from random rows at random offsets, a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step, 1])
    picks = rng.integers(0, rows.shape[0], count)
    offsets = rng.integers(0, rows.shape[1] - seq, count)                   # window end ≤ row length
    return torch.from_numpy(np.stack([rows[r, o:o + seq + 1] for r, o in zip(picks, offsets)]).astype(np.int64))
