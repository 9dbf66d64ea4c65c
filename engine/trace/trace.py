"""Trace: the facts a forward pass and generation record (routing, mHC, Engram, attention, lens, tokens, DSpark)."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .decode import decode_tables
from .formats import read_tables, read_tables_bytes, trace_format, write_tables
from .lens import finished_rows, lens_values
from .pending_logits import PendingLogits
from .recorder import FactRecorder
from .records import MHC_SITES, DSparkStep, TokenRecord, TraceBudget, path_order
from .tables import TraceFormatError, build_tables

if TYPE_CHECKING:  # the trace loads without torch: the logits are the model's
    import torch


class Trace(FactRecorder):
    """Records facts during forward/generate. Pass it explicitly; with no trace nothing is recorded.

    The model's per-token facts go into numpy columns (FactRecorder); generation adds the tokens (with top-k
    logits) and the DSpark steps. The tables, files and queries read them."""

    def __init__(self, budget: TraceBudget | None = None, meta: dict[str, Any] | None = None) -> None:
        super().__init__(budget)
        self.meta: dict[str, Any] = dict(meta or {})
        self._tokens: dict[int, dict[int, TokenRecord]] = {}
        self._pending_logits = PendingLogits()   # generated tokens' logits until a token record is read
        self.dspark_steps: list[DSparkStep] = []

    @property
    def interventions(self) -> list[str]:
        """The run's interventions as canonical texts (engine.request.interventions), as generation wrote them into
        meta["interventions"]; [] for a run without any, or a trace older than the key."""
        return [str(text) for text in self.meta.get("interventions") or ()]

    # ---- what generation calls ------------------------------------------------------------
    def record_prompt(self, row: int, token_ids: Iterable[int], texts: Iterable[str], start_pos: int = 0) -> None:
        for i, (tid, text) in enumerate(zip(token_ids, texts, strict=True)):
            self._tokens.setdefault(row, {})[start_pos + i] = TokenRecord(row, start_pos + i, int(tid), text, False)

    def record_prompt_logits(self, row: int, start_pos: int, logits: torch.Tensor) -> None:
        """Teacher-forced logits [L, V] of a recorded prompt at positions start_pos..start_pos+L-1: row j is the
        model's prediction of the prompt token at start_pos + j + 1, which gets its top-k and log-probability."""
        tokens = self._tokens.get(row, {})
        scored = {j: rec for j in range(len(logits))
                  if (rec := tokens.get(start_pos + j + 1)) is not None and not rec.generated}
        if not scored:
            return
        from .token_logits import set_predicted  # (torch: only generation passes logits here)
        set_predicted(list(scored.values()), logits[list(scored)], self.budget.top_k_logits)

    def record_token(self, row: int, pos: int, token_id: int, text: str, *, step: int, step_time_s: float,
                     logits: torch.Tensor | None = None) -> None:
        """A generated token at `pos`; `logits` [V] (the distribution it was drawn from) gives the top-k and the
        token's log-probability (worked out for many tokens at once, when a token record is read)."""
        self._end_step()  # once per step: the step's records are written (GPU ones: their pinned memory freed)
        rec = TokenRecord(int(row), int(pos), int(token_id), text, True, int(step), float(step_time_s))
        if logits is not None:
            self._pending_logits.add(rec, logits, self.budget.top_k_logits)
        self._tokens.setdefault(rec.row, {})[rec.pos] = rec

    def _settle(self) -> None:
        """Before a read: the GPU records in flight written and the seams completed (FactRecorder._settle), then
        the logit lens's pending read-outs (all layers, all tokens) turned into "lens" records by the recording
        model's head (engine.trace.lens), and dropped."""
        super()._settle()
        blocks = []
        for key in [key for key in self._columns if key[0] in ("lens_hidden", "lens_prenorm")]:
            columns = self._columns.pop(key)
            rows, pos, fields = columns.block(np.arange(columns.n))
            if len(rows):
                hidden, rms_in, rms_out = (values for values, _ in fields)
                if key[0] == "lens_prenorm":   # not read out to the end: finished now, row by row
                    hidden = finished_rows(hidden, self._lens_finish)
                blocks.append((key[1], rows, pos, [hidden, rms_in, rms_out]))
        if blocks:
            hidden = np.concatenate([fields[0] for *_, fields in blocks])            # [N, dim]: every layer's tokens
            next_ids = np.concatenate([self._next_ids(rows, pos) for _, rows, pos, _ in blocks])
            values = lens_values(hidden, next_ids, self._lens_readout, self.budget.top_k_logits)
            start = 0
            for path, rows, pos, (_, rms_in, rms_out) in blocks:
                part = [v[start:start + len(rows)] for v in values]
                top_ids, top_probs, next_rank, next_prob = part
                next_id = next_ids[start:start + len(rows)]
                self._columns_for("lens", path, "").put(rows, pos, [top_ids, top_probs, next_id, next_rank,
                                                                     next_prob, rms_in, rms_out])
                start += len(rows)
        self._lens_readout = self._lens_finish = None   # (a trace outlives its model: hold no reference to it)

    def _next_ids(self, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The token id recorded at each (row, pos + 1), -1 where none is."""
        out = np.full(len(rows), -1, np.int64)
        for i, (row, p) in enumerate(zip(rows.tolist(), pos.tolist())):
            rec = self._tokens.get(row, {}).get(p + 1)
            if rec is not None:
                out[i] = rec.token_id
        return out

    def recorded_tokens(self) -> list[TokenRecord]:
        """The token records of every row as recorded so far, in (row, pos) order, without settling anything (no
        top-k worked out, no lens read out): what a writer that saves a run as it generates reads between steps."""
        return [rec for row in sorted(self._tokens) for _, rec in sorted(self._tokens[row].items())]

    def record_tokens(self, records: Iterable[TokenRecord]) -> None:
        """Token records as they are (a partial trace rebuilt from recorded_tokens)."""
        for rec in records:
            self._tokens.setdefault(rec.row, {})[rec.pos] = rec

    def record_dspark_step(self, step: DSparkStep) -> None:
        self.dspark_steps.append(step)

    def rollback(self, row: int, pos: int) -> None:
        """Forget every record of `row` at positions >= pos (rejected speculative tokens)."""
        self._drop_facts(row, pos)
        tokens = self._tokens.get(row, {})
        for p in [p for p in tokens if p >= pos]:
            del tokens[p]
        self.dspark_steps = [s for s in self.dspark_steps if s.row != row or s.anchor_pos < pos]

    # ---- accessors ------------------------------------------------------------------------
    def rows(self) -> list[int]:
        return sorted(set(self._slots.by_row) | set(self._tokens) | {s.row for s in self.dspark_steps})

    def tokens(self, row: int = 0) -> list[TokenRecord]:
        """The row's prompt and generated tokens in position order."""
        self._pending_logits.resolve(self.budget.top_k_logits)
        return [rec for _, rec in sorted(self._tokens.get(row, {}).items())]

    def mhc_matrix(self, path: str, site: str, row: int, pos: int) -> np.ndarray:
        rec = self.fact("mhc", path, row, pos, site)
        if rec is None:
            raise KeyError(f"no mHC record for {path} {site} at row {row}, position {pos}")
        return rec["comb"]

    def mhc_products(self, row: int, pos: int, upto: str | None = None) -> list[tuple[str, str, np.ndarray]]:
        """(path, site, C_1 @ ... @ C_k) after each recorded backbone mHC seam k, in depth order (float64).

        Each matrix C maps source stream a to destination b (X'_b = Σ_a C[a,b] X_a), so the residual path
        through seams 1..n is C_1 @ C_2 @ ... @ C_n in the same [source, dest] layout.
        """
        seams = [(p, s) for p in self.paths("mhc") if p.startswith("layers.") for s in MHC_SITES]
        # (the draft stages restart their streams, so they are not part of the backbone's product)
        if upto is not None:
            seams = [(p, s) for p, s in seams if path_order(p) <= path_order(upto)]
        products, product = [], None
        for p, s in seams:
            rec = self.fact("mhc", p, row, pos, s)
            if rec is None:
                continue
            c = rec["comb"].astype(np.float64)
            product = c if product is None else product @ c
            products.append((p, s, product))
        return products

    def mhc_composite(self, row: int, pos: int, upto: str | None = None) -> tuple[np.ndarray, float]:
        """Product of the recorded backbone mHC matrices in depth order (see mhc_products), and its gain."""
        products = self.mhc_products(row, pos, upto)
        if not products:
            raise KeyError(f"no mHC records at row {row}, position {pos}")
        product = products[-1][2]
        return product, mhc_gain(product)

    def expert_load(self, path: str, n_experts: int | None = None) -> np.ndarray:
        """How many recorded tokens routed to each expert of a layer (counts over the kept tokens)."""
        flat = self._all_values("moe", path, "", 0)
        size = n_experts if n_experts is not None else (int(flat.max()) + 1 if flat.size else 0)
        return np.bincount(flat, minlength=size).astype(np.int64)

    def moe_table(self) -> dict[str, np.ndarray]:
        """One row per token × layer × routed slot: path, row, pos, slot, expert, weight, score, vision."""
        return self.table("moe")

    def table(self, name: str) -> dict[str, np.ndarray]:
        """Columnar, pandas-ready table: moe, mhc, engram, attention, tokens, dspark or lens."""
        return build_tables(self, only=name)[0][name]

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows(), "token_slots": self._slots.count, "records": self._counts(),
                "tokens": sum(len(t) for t in self._tokens.values()), "dspark_steps": len(self.dspark_steps),
                "omitted": dict(self.omitted)}

    # ---- tables and files -----------------------------------------------------------------
    def to_tables(self) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """(tables, header): every table as 1-D columns, and the budget, meta, omitted counts and shapes."""
        return build_tables(self)

    @classmethod
    def from_tables(cls, tables: dict[str, dict[str, np.ndarray]], header: dict[str, Any]) -> Trace:
        """Rebuild a trace from to_tables output (after any file round trip); raises TraceFormatError.
        Its facts bypass the budget: the saved trace honoured it."""
        contents = decode_tables(tables, header)
        trace = cls(contents.budget, contents.meta)
        trace.omitted.update(contents.omitted)
        trace._restore_facts(contents.facts)
        for rec in contents.tokens:
            trace._tokens.setdefault(rec.row, {})[rec.pos] = rec
        trace.dspark_steps.extend(contents.dspark_steps)
        return trace

    def save(self, path: str | Path, fmt: str | None = None) -> Path:
        """Write the trace as JSON, a Parquet zip or safetensors (default: from the file suffix)."""
        fmt = fmt or trace_format(path)
        return write_tables(*self.to_tables(), path, fmt)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by save; a corrupt, foreign or oversized file raises TraceFormatError naming it."""
        return cls._from_file(str(path), *read_tables(path))

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> Trace:
        """Trace.load for a file's bytes (an upload): `name`'s suffix picks the format; errors name it."""
        return cls._from_file(name, *read_tables_bytes(name, data))

    @classmethod
    def _from_file(cls, name: str, tables, header) -> Trace:
        try:
            return cls.from_tables(tables, header)
        except TraceFormatError as e:
            raise TraceFormatError(f"{name}: {e}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if (self.budget, self.meta, +self.omitted, self.dspark_steps) != \
                (other.budget, other.meta, +other.omitted, other.dspark_steps):
            return False
        self._pending_logits.resolve(self.budget.top_k_logits)
        other._pending_logits.resolve(other.budget.top_k_logits)
        if _nonempty(self._tokens) != _nonempty(other._tokens):
            return False
        return self._same_facts(other)


def _nonempty(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


def mhc_gain(product: np.ndarray) -> float:
    """Largest absolute row or column sum: 1 for a doubly stochastic product, larger when streams amplify."""
    return float(max(np.abs(product).sum(0).max(), np.abs(product).sum(1).max()))


def save_trace(trace: Trace, path: str | Path, fmt: str | None = None) -> Path:
    """Trace.save as a function."""
    return trace.save(path, fmt)


def load_trace(path: str | Path) -> Trace:
    """Trace.load as a function."""
    return Trace.load(path)


def load_trace_bytes(name: str, data: bytes) -> Trace:
    """Trace.from_bytes as a function: a trace from an uploaded file's name and bytes."""
    return Trace.from_bytes(name, data)
