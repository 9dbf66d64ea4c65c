"""FactRecorder: each layer's per-token facts recorded into numpy columns, one FactColumns per (kind, path, site)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..spec.errors import InputError
from .arrays import StagedCopy, host_view
from .columns import FactColumns
from .last_call import LastCall
from .records import MHC_SITES, PENDING_KIND_OF, RECORDED_DTYPES, RECORDED_FIELDS, TraceBudget, layer_path, path_order
from .seams import MIX_KIND, derives_later, packed_mix, post_comb, seam_values, stochastic_errors
from .slots import CallTokens, TokenSlots
from .step_records import StepRecords

if TYPE_CHECKING:  # tensors come from the model's side: named for annotations only
    import torch

    from .arrays import Array

NO_VISION = np.zeros((1, 1), bool)  # the vision mask of a one-token call without one (the columns copy it)
NO_VISION.flags.writeable = False
MAX_PENDING = 256  # GPU records in flight before they are written out (the caching host allocator reuses their memory)


def check_site(site: str) -> None:
    if site not in MHC_SITES:
        raise InputError(f"record_mhc: site must be one of {MHC_SITES}, got {site!r}")


class FactRecorder:
    """What the model calls (record_*), kept under the budget, with no Python object per token; facts() and friends
    read the columns. A call is checked and copied into the columns (one numpy copy per field; from a GPU one
    non-blocking copy per call), except a decode step's one-token calls after its first: those are kept as they
    are and stacked when the step ends (StepRecords), one copy per kind and field for the step."""

    def __init__(self, budget: TraceBudget | None = None) -> None:
        self.budget = budget or TraceBudget()
        self.omitted: Counter[str] = Counter()
        self._columns: dict[tuple[str, str, str], FactColumns] = {}   # (kind, path, site) -> its records
        self._slots = TokenSlots(self.budget.max_tokens)
        self._pending: list[tuple] = []   # GPU records whose host copy may still be in flight (see _flush)
        self._last_call: LastCall | None = None   # the last record call's tensors, their bytes and its tokens
        self._step = StepRecords()   # the one-token records of _last_call's tokens, until the step ends (_defer)
        self._lens_readout = None   # the recording model's read-out of the lens (see record_lens), until resolved
        self._lens_finish = None    # and the rest of its read-out, for read-outs recorded before it (lens_prenorm)
        self._wants: dict[tuple[str, str], bool] = {}   # (kind, path) -> whether the budget records it

    # ---- what the model calls -------------------------------------------------------------
    def record_moe(self, path: str, rows: Array, positions: Array, ids: Array, weights: Array, scores: Array,
                   vision: Array | None = None) -> None:
        if vision is None:
            vision = NO_VISION if positions.shape == (1, 1) else np.zeros(tuple(ids.shape[:2]), bool)
        values = (ids, weights, scores, vision)
        if not self._defer(("moe", path, ""), rows, positions, values) and not self._skipped("moe", path, positions):
            self._record("moe", path, "", rows, positions, values)

    def record_mhc(self, path: str, site: str, rows: Array, positions: Array, pre: Array, post: Array, comb: Array,
                   row_err: Array | None = None, col_err: Array | None = None) -> None:
        """One mHC seam: pre, post [B, S, hc], comb [B, S, hc, hc]; row_err, col_err [B, S], comb's largest
        |row sum − 1| and |column sum − 1|. Left out (as the model does), they are derived from comb: for an fp32
        host comb when the trace is read, for all its records at once (engine.trace.seams), else now."""
        check_site(site)
        if row_err is None or col_err is None:
            if derives_later(comb):
                return self.record_mhc_mix(path, site, rows, positions, pre, packed_mix(post, comb))
            row_err, col_err = stochastic_errors(comb)
        self._record_mhc("mhc", path, site, rows, positions, (pre, post, comb, row_err, col_err))

    def record_mhc_mix(self, path: str, site: str, rows: Array, positions: Array, pre: Array, mix: Array) -> None:
        """One mHC seam as the fused seam holds it (engine.speedups.fast_mhc.Seam): pre [B, S, hc] and mix
        [B, S, hc, hc + 1] = [combᵀ | post]; post, comb and the residuals come out when the trace is read (now
        where mix is not an fp32 host tensor, as record_mhc does)."""
        check_site(site)
        if derives_later(mix):
            return self._record_mhc(MIX_KIND, path, site, rows, positions, (pre, mix))
        post, comb = post_comb(mix)
        self._record_mhc("mhc", path, site, rows, positions, (pre, post, comb, *stochastic_errors(comb)))

    def _record_mhc(self, kind: str, path: str, site: str, rows, positions, values: tuple) -> None:
        if not self._defer((kind, path, site), rows, positions, values) and not self._skipped("mhc", path, positions):
            self._record(kind, path, site, rows, positions, values)

    def record_engram(self, path: str, rows: Array, positions: Array, compressed_ids: Array, row_ids: Array,
                      gates: Array) -> None:
        values = (compressed_ids, row_ids, gates)
        if not self._defer(("engram", path, ""), rows, positions, values) and \
                not self._skipped("engram", path, positions):
            self._record("engram", path, "", rows, positions, values)

    def wants_attention(self, path: str) -> bool:
        wanted = self._wants.get(("attention", path))
        if wanted is None:  # (the budget is frozen: worked out once per path)
            a = self.budget.attention
            chosen = a if isinstance(a, bool) else (path in a or layer_path(path) in a)
            wanted = self._wants[("attention", path)] = chosen and self.budget.keeps_layer(path)
        return wanted

    def record_attention(self, path: str, rows: Array, positions: Array, topk: Array, window_mass: Array,
                         compressed_mass: Array, sink_mass: Array) -> None:
        if not self.wants_attention(path):
            return
        values = (topk, window_mass, compressed_mass, sink_mass)
        if not self._defer(("attention", path, ""), rows, positions, values) and \
                not self._skipped("attention", path, positions):
            self._record("attention", path, "", rows, positions, values)

    def wants_lens(self, path: str) -> bool:
        """Whether the logit lens of a backbone layer ('layers.3') is recorded (budget.lens and its layers)."""
        wanted = self._wants.get(("lens", path))
        if wanted is None:
            wanted = self._wants[("lens", path)] = self.budget.lens and self.budget.keeps_layer(path)
        return wanted

    def record_lens(self, path: str, rows: Array, positions: Array, hidden: Array, rms_in: Array, rms_out: Array,
                    readout: Callable[[torch.Tensor], torch.Tensor],
                    finish: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """The logit lens of one layer: hidden [B, S, dim], the layer's output streams read out the way the model
        reads out its last layer (collapse, final norm); rms_in, rms_out [B, S, hc], each hc stream's RMS entering
        and leaving the layer. readout(hidden [N, dim]) -> logits [N, V]: the model's head. The hidden states are
        kept until the trace is read; then one batched head matmul turns them into the "lens" records (top-k,
        the next token's rank and probability) and they are dropped (engine.trace.lens). finish: given for a hidden
        not yet read out (a one-token step's: V4.1's collapse before the final norm, [B, S, dim], or V4's streams
        [B, S, hc, dim]), the rest of the model's read-out (the final norm; V4's hc_head and final norm), which the
        trace applies to each such row on its own when it resolves the lens (as the step would have: a batch may
        round otherwise)."""
        if not self.wants_lens(path):
            return
        self._lens_readout = readout
        kind = "lens_hidden"
        if finish is not None:
            kind, self._lens_finish = "lens_prenorm", finish
        values = (hidden, rms_in, rms_out)
        if not self._defer((kind, path, ""), rows, positions, values):
            self._record(kind, path, "", rows, positions, values)

    def _defer(self, key: tuple[str, str, str], rows, positions, values: tuple) -> bool:
        """The decode fast path: a one-token call with the rows and positions tensors (and values) of the call
        before it (the layers of one forward), every layer kept and no GPU copy in flight. Its values are kept as
        they are (True) and written with the rest of the step's when it ends (StepRecords: at the token record, the
        next forward, a rollback or any read). False, with nothing kept, sends the call down the checked path."""
        last = self._last_call
        if last is None or last.tokens.single is None or self._pending or self.budget.layers is not None or \
                not last.same_tokens(rows, positions, self._slots.epoch):
            return False
        self._step.keep(key, values)
        return True

    # ---- reading --------------------------------------------------------------------------
    def paths(self, kind: str) -> list[str]:
        found = {key[1] for key, columns in self._filled() if key[0] == kind}
        return sorted(found, key=path_order)

    def fact(self, kind: str, path: str, row: int, pos: int, site: str = "") -> dict[str, np.ndarray] | None:
        """One record as {field: array}, or None when it was not recorded."""
        self._settle()
        columns = self._columns.get((kind, path, site))
        i = None if columns is None else columns.find(row, pos)
        return None if i is None else dict(zip(RECORDED_FIELDS[kind], columns.entry(i)))

    def facts(self, kind: str) -> list[tuple[str, str, int, int, tuple]]:
        """Every record of a kind, ordered by (path depth, site, row, pos): (path, site, row, pos, fields)."""
        out = []
        for (_, path, site), columns in self._sorted(kind):
            order = columns.order()
            out.extend((path, site, row, pos, values) for row, pos, values in
                       zip(columns.rows[order].tolist(), columns.pos[order].tolist(), columns.entries(order)))
        return out

    def fact_columns(self, kind: str) -> list[tuple]:
        """facts(kind) as column blocks, one per (path, site) in the same order: (path, site, rows [m], pos [m],
        [(values [m, *width], per-entry shapes [m, ndim] or None when all have the width) per field])."""
        blocks = []
        for (_, path, site), columns in self._sorted(kind):
            blocks.append((path, site, *columns.block(columns.order())))
        return blocks

    def _all_values(self, kind: str, path: str, site: str, field: int) -> np.ndarray:
        """Every recorded value of one field of a (kind, path, site), flattened (the budget's kept tokens)."""
        columns = dict(self._filled()).get((kind, path, site))
        if columns is None:
            return np.zeros(0, RECORDED_DTYPES[kind][field])
        column = columns.fields[field]
        if column.shapes is None:
            return column.buf[: columns.n].reshape(-1).copy()
        return np.concatenate([np.asarray(v).reshape(-1) for v in column.values(columns.n)])

    def _counts(self) -> dict[str, int]:
        """Records per kind, kinds in the order they were first recorded."""
        counts: dict[str, int] = {}
        for (kind, _, _), columns in self._filled():
            counts[kind] = counts.get(kind, 0) + columns.n
        return counts

    def _restore_facts(self, facts) -> None:
        """The facts of a rebuilt trace, (kind, path, site, row, pos, values) each (the budget was honoured when
        they were recorded)."""
        grouped: dict[tuple[str, str, str], tuple[list, list, list]] = {}
        for kind, path, site, row, pos, values in facts:
            group = grouped.get((kind, path, site))
            if group is None:
                group = grouped[(kind, path, site)] = ([], [], [])
            group[0].append(row)
            group[1].append(pos)
            group[2].append(values)
        for key, (rows, positions, entries) in grouped.items():
            self._columns_for(*key).extend(rows, positions, entries)
            self._slots.add_many(rows, positions)

    def _drop_facts(self, row: int, pos: int) -> None:
        """Forget the row's facts at positions >= pos and free their token slots."""
        self._flush()
        for columns in self._columns.values():
            columns.drop_from(row, pos)
        self._slots.drop_from(row, pos)

    def _same_facts(self, other: FactRecorder) -> bool:
        mine, theirs = dict(self._filled()), dict(other._filled())
        return mine.keys() == theirs.keys() and all(columns.same_as(theirs[key]) for key, columns in mine.items())

    # ---- recording --------------------------------------------------------------------------
    def _skipped(self, kind: str, path: str, positions) -> bool:
        """Count and skip a layer outside the budget before any copying (checking the positions' shape)."""
        if self.budget.layers is None or self.budget.keeps_layer(path):
            return False
        b, s = self._call_shape(kind, path, positions)
        self.omitted[kind] += b * s
        return True

    def _record(self, kind: str, path: str, site: str, rows, positions, values: tuple,
                call: CallTokens | None = None) -> None:
        """Check the call's fields, admit its tokens under the budget and copy the kept ones into the columns: one
        numpy copy per field from a CPU tensor; from a GPU one non-blocking copy now, written at the next _flush.
        call: the tokens of a deferred record (then rows and positions are not read)."""
        if call is None:
            self._write_step()  # (the records before this one first)
            call = self._known_call(rows, positions)
        bs = call.positions.shape if call is not None else self._call_shape(kind, path, positions)
        arrays = []
        for v in values:
            if type(v) is not np.ndarray:
                try:
                    v = v.numpy()  # a CPU tensor: a view (the columns copy it)
                except (AttributeError, RuntimeError, TypeError):  # a list, grad, bf16, or a GPU tensor
                    if getattr(v, "is_cuda", False):
                        return self._stage(kind, path, site, rows, positions, call, values)
                    v = host_view(v)
            arrays.append(v)
            if v.shape[:2] != bs:
                self._check_fields(kind, path, bs, arrays)
        call = call or self._admit(kind, path, rows, positions)
        if call.refused:
            self.omitted[PENDING_KIND_OF.get(kind, kind)] += call.refused
        if self._pending:
            self._flush()
        self._step.drain(self._columns_for, key=(kind, path, site))  # (its earlier records first)
        (self._columns.get((kind, path, site)) or self._columns_for(kind, path, site)).record(call, arrays)

    def _stage(self, kind: str, path: str, site: str, rows, positions, call: CallTokens | None, values: tuple) -> None:
        self._check_fields(kind, path, tuple((call.positions if positions is None else positions).shape), values)
        self._step.drain(self._columns_for)  # (the GPU records go straight into the columns, after those before)
        call = call or self._admit(kind, path, rows, positions)
        if call.refused:
            self.omitted[PENDING_KIND_OF.get(kind, kind)] += call.refused
        self._pending.append((self._columns_for(kind, path, site), call, StagedCopy(values, RECORDED_DTYPES[kind])))
        if len(self._pending) >= MAX_PENDING:
            self._flush()

    def _known_call(self, rows, positions) -> CallTokens | None:
        """The last call's tokens when this call passes the same rows and positions tensors with the same values
        (read through views of their memory) and no slot was freed since: every layer of a forward does."""
        last = self._last_call
        if last is not None and last.same_tokens(rows, positions, self._slots.epoch):
            return last.tokens
        return None

    def _admit(self, kind: str, path: str, rows, positions) -> CallTokens:
        """The call's tokens, admitted under the budget (remembered for the next call: see _known_call)."""
        self._write_step()   # (the deferred records are of the last call's tokens)
        b, s = self._call_shape(kind, path, positions)
        pos_view = host_view(positions)
        rows_view = None if rows is None else host_view(rows)
        row_list = list(range(b)) if rows is None else np.asarray(rows_view, np.int64).reshape(-1).tolist()
        if len(row_list) != b:
            raise InputError(f"record_{kind}({path}): rows must be [B={b}], got {len(row_list)} rows")
        call = self._slots.admit(row_list, np.array(pos_view, np.int64).reshape(b, s))  # a copy of its own
        self._last_call = LastCall(positions, rows, self._slots.epoch, pos_view, pos_view.tobytes(), rows_view,
                                   None if rows is None else rows_view.tobytes(), call)
        return call

    @staticmethod
    def _call_shape(kind: str, path: str, positions) -> tuple[int, int]:
        shape = tuple(positions.shape)
        if len(shape) != 2:
            raise InputError(f"record_{kind}({path}): positions must be [B, S], got shape {shape}")
        return shape

    @staticmethod
    def _check_fields(kind: str, path: str, bs: tuple[int, int], values) -> None:
        for name, v in zip(RECORDED_FIELDS[kind], values):
            if tuple(v.shape[:2]) != tuple(bs):
                raise InputError(f"record_{kind}({path}): '{name}' must start with [B={bs[0]}, S={bs[1]}], "
                                 f"got {tuple(v.shape)}")

    def _write_step(self) -> None:
        """End the step: its deferred records (see _defer) into the StepTables or the columns."""
        if self._step.kept:
            call = self._last_call.tokens   # (_defer kept only records of these tokens; _admit ends the step first)
            self._step.write(*call.single, self._columns.get, self._columns_for,
                             lambda key, values: self._record(*key, None, None, values, call=call))

    def _end_step(self) -> None:
        """Write the step's deferred records (into the tables), then the GPU records whose host copies were in
        flight, into their columns in arrival order: what the token record does once per step."""
        self._write_step()
        if self._pending:
            pending, self._pending = self._pending, []
            for columns, call, staged in pending:
                columns.record(call, staged.arrays())

    def _flush(self) -> None:
        """Every record in its columns (_end_step, and the tables drained): before a read or a rollback."""
        self._end_step()
        self._step.drain(self._columns_for)

    def _columns_for(self, kind: str, path: str, site: str) -> FactColumns:
        columns = self._columns.get((kind, path, site))
        if columns is None:
            columns = self._columns[(kind, path, site)] = FactColumns(
                f"record_{kind}({path})", dict(zip(RECORDED_FIELDS[kind], RECORDED_DTYPES[kind])))
        return columns

    def _sorted(self, kind: str) -> list[tuple[tuple[str, str, str], FactColumns]]:
        """The kind's filled keys in table order: path depth, then site."""
        keys = [(k, c) for k, c in self._filled() if k[0] == kind]
        return sorted(keys, key=lambda kc: (path_order(kc[0][1]), kc[0][2]))

    def _settle(self) -> None:
        """Before a read: write the GPU records in flight, then complete the seams recorded without their residuals
        (the Trace also resolves its pending lens records)."""
        self._flush()
        for key in [key for key in self._columns if key[0] == MIX_KIND]:
            columns = self._columns.pop(key)
            if columns.n:
                rows, pos, fields = columns.block(np.arange(columns.n))
                self._columns_for("mhc", *key[1:]).put(rows, pos, seam_values(*(values for values, _ in fields)))

    def _filled(self) -> list[tuple[tuple[str, str, str], FactColumns]]:
        """((kind, path, site), columns) of every key that holds records."""
        self._settle()
        return [(key, columns) for key, columns in self._columns.items() if columns.n]
