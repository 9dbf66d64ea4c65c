"""The Trace's value types: fact fields, its budget, token and DSpark-step records, and path helpers (numpy only)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..spec.errors import InputError

# Fields each kind of per-token × layer fact carries, in the order the model passes them.
FACT_FIELDS: dict[str, tuple[str, ...]] = {
    "moe": ("ids", "weights", "scores", "vision"),
    "mhc": ("pre", "post", "comb", "row_err", "col_err"),
    "engram": ("compressed_ids", "row_ids", "gates"),
    "attention": ("topk", "window_mass", "compressed_mass", "sink_mass"),
    "lens": ("top_ids", "top_probs", "next_id", "next_rank", "next_prob", "rms_in", "rms_out"),
}
# What each field is stored as (model tensors of other dtypes are converted exactly: bf16 -> fp32, int32 -> int64).
FACT_DTYPES: dict[str, tuple[str, ...]] = {
    "moe": ("int64", "float32", "float32", "bool"),
    "mhc": ("float32",) * 5,
    "engram": ("int64", "int64", "float32"),
    "attention": ("int64", "float32", "float32", "float32"),
    "lens": ("int64", "float32", "int64", "int64", "float32", "float32", "float32"),
}
FACT_KINDS = tuple(FACT_FIELDS)
# Kinds the model records that the trace turns into another kind when it is read: the logit lens's read-out per
# layer and token becomes its top-k (one batched head matmul for the whole run, engine.trace.lens; a lens_prenorm
# read-out is not finished yet: the trace applies the rest of the model's read-out row by row first, V4.1's final
# norm of the collapse or V4's hc_head and final norm of the streams); an mHC seam recorded as
# (pre, mix = [combᵀ | post]) is unpacked and given its Sinkhorn residuals (all records at once, engine.trace.seams).
PENDING_FIELDS: dict[str, tuple[str, ...]] = {"lens_hidden": ("hidden", "rms_in", "rms_out"),
                                              "lens_prenorm": ("hidden", "rms_in", "rms_out"),
                                              "mhc_mix": ("pre", "mix")}
PENDING_DTYPES: dict[str, tuple[str, ...]] = {"lens_hidden": ("float32",) * 3, "lens_prenorm": ("float32",) * 3,
                                              "mhc_mix": ("float32",) * 2}
# the kind a pending kind becomes (and counts its omitted tokens as)
PENDING_KIND_OF = {"lens_hidden": "lens", "lens_prenorm": "lens", "mhc_mix": "mhc"}
RECORDED_FIELDS = {**FACT_FIELDS, **PENDING_FIELDS}
RECORDED_DTYPES = {**FACT_DTYPES, **PENDING_DTYPES}
MHC_SITES = ("attn", "ffn")


@dataclass(frozen=True)
class TraceBudget:
    """What a Trace keeps. Facts beyond the budget are counted in `Trace.omitted`, never stored.

    max_tokens: distinct (row, position) token slots that get per-layer facts (first come, first kept;
    rollback frees slots). None = unbounded. layers: None = every layer, else the dotted paths (or backbone
    layer numbers) to keep. attention: False, True (every layer) or a set of paths. top_k_logits: per
    generated token, how many of the highest logits to keep (and per layer of the logit lens). lens: record the
    logit lens and the residual-stream RMS per kept layer and token (engine.trace.lens).
    """
    max_tokens: int | None = 2048
    layers: frozenset[str] | None = None
    attention: bool | frozenset[str] = False
    top_k_logits: int = 5
    lens: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 0):
            raise InputError(f"TraceBudget.max_tokens must be a non-negative integer or None, got {self.max_tokens!r}")
        if not isinstance(self.top_k_logits, int) or self.top_k_logits < 0:
            raise InputError(f"TraceBudget.top_k_logits must be a non-negative integer, got {self.top_k_logits!r}")
        if self.layers is not None:
            object.__setattr__(self, "layers", frozenset(as_path(x) for x in self.layers))
        if not isinstance(self.attention, bool):
            object.__setattr__(self, "attention", frozenset(as_path(x) for x in self.attention))
        if not isinstance(self.lens, bool):
            raise InputError(f"TraceBudget.lens must be True or False, got {self.lens!r}")

    def keeps_layer(self, path: str) -> bool:
        """Whether facts of a module path ('layers.3', 'layers.3.attn', 'mtp.0.ffn') are kept."""
        return self.layers is None or path in self.layers or layer_path(path) in self.layers

    def to_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens,
                "layers": None if self.layers is None else sorted(self.layers, key=path_order),
                "attention": self.attention if isinstance(self.attention, bool)
                else sorted(self.attention, key=path_order),
                "top_k_logits": self.top_k_logits, "lens": self.lens}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TraceBudget":
        attention = d.get("attention", False)
        return cls(max_tokens=d.get("max_tokens"), layers=None if d.get("layers") is None else d["layers"],
                   attention=attention if isinstance(attention, bool) else frozenset(attention),
                   top_k_logits=d.get("top_k_logits", 5), lens=d.get("lens", False))


@dataclass
class TokenRecord:
    """One token of a row: a prompt token (generated=False) or a generated one with its top-k logits."""
    row: int
    pos: int
    token_id: int
    text: str
    generated: bool
    step: int = -1                  # decode step that produced it (-1 for prompt tokens)
    step_time_s: float = math.nan   # wall time of the forward that produced it
    top_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top_logits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    top_probs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    logprob: float = math.nan       # log-probability the model gave this token at its position (a prompt token's
    #                                 teacher-forced, from the prompt's logits; NaN when not recorded)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenRecord) and records_equal(vars(self), vars(other))


@dataclass
class DSparkStep:
    """One speculative step of a row: what was drafted from the anchor, what the verifier kept."""
    row: int
    step: int
    anchor_pos: int                 # position of the last committed token the drafts follow
    anchor_token: int
    drafted: np.ndarray             # [n] int64 draft token ids
    draft_probs: np.ndarray         # [n] float32 q(x_i) under the drafter
    confidences: np.ndarray         # [g] float32 calibrated confidence per draft slot
    survival: np.ndarray            # [g] float32 running product of confidences
    verify_len: int                 # drafts the scheduler sent to verification
    accepted: int                   # drafts the verifier accepted
    next_token: int                 # replacement (after a rejection) or bonus token (all accepted)
    next_kind: str                  # "replacement" | "bonus"
    time_s: float

    def __post_init__(self) -> None:
        if self.next_kind not in ("replacement", "bonus"):
            raise InputError(f"DSparkStep.next_kind must be 'replacement' or 'bonus', got {self.next_kind!r}")
        if not 0 <= self.accepted <= self.verify_len <= len(self.drafted):
            raise InputError(f"DSparkStep needs 0 <= accepted ({self.accepted}) <= verify_len ({self.verify_len})"
                             f" <= drafted ({len(self.drafted)})")
        self.drafted = np.asarray(self.drafted, np.int64).reshape(-1)
        for name in ("draft_probs", "confidences", "survival"):
            setattr(self, name, np.asarray(getattr(self, name), np.float32).reshape(-1))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DSparkStep) and records_equal(vars(self), vars(other))


def layer_path(path: str) -> str:
    """The layer a module path belongs to: 'layers.3.attn' -> 'layers.3', 'mtp.0.ffn' -> 'mtp.0'."""
    return ".".join(path.split(".")[:2])


def path_order(path: str) -> tuple[int, int, str]:
    """Sort key for dotted paths: backbone layers by number, then draft stages, then anything else."""
    head, _, rest = path.partition(".")
    num, _, tail = rest.partition(".")
    group = {"layers": 0, "mtp": 1}.get(head, 2)
    return (group, int(num) if num.isdigit() else -1, path if group == 2 else tail)


def as_path(x: int | str) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise InputError(f"TraceBudget: a layer must be a number or a dotted path like 'layers.3', got {x!r}")
    return f"layers.{x}" if isinstance(x, int) else x


def arrays_equal(a: object, b: object) -> bool:
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def records_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(arrays_equal(a[k], b[k]) for k in a)
