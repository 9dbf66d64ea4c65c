"""FactRecorder: each layer's per-token facts recorded into numpy columns, one FactColumns per (kind, path, site)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..spec.errors import InputError
from .arrays import StagedCopy, host_int64, host_view
from .columns import FactColumns
from .records import MHC_SITES, PENDING_KIND_OF, RECORDED_DTYPES, RECORDED_FIELDS, TraceBudget, layer_path, path_order
from .slots import CallTokens, TokenSlots

NO_VISION = np.zeros((1, 1), bool)  # the vision mask of a one-token call without one (the columns copy it)
NO_VISION.flags.writeable = False
MAX_PENDING = 256  # GPU records in flight before they are written out (the caching host allocator reuses their memory)


class FactRecorder:
    """What the model calls (record_*), kept under the budget. A record call costs one numpy copy per field (from
    a GPU one non-blocking copy per call), with no Python object per token; facts() and friends read the columns."""

    def __init__(self, budget: TraceBudget | None = None):
        self.budget = budget or TraceBudget()
        self.omitted: Counter[str] = Counter()
        self._columns: dict[tuple[str, str, str], FactColumns] = {}   # (kind, path, site) -> its records
        self._slots = TokenSlots(self.budget.max_tokens)
        self._pending: list[tuple] = []   # GPU records whose host copy may still be in flight (see _flush)
        self._last_call: tuple | None = None   # the last record call's tensors, their bytes and its CallTokens
        self._lens_readout = None   # the recording model's read-out of the lens (see record_lens), until resolved

    # ---- what the model calls -------------------------------------------------------------
    def record_moe(self, path, rows, positions, ids, weights, scores, vision=None) -> None:
        if vision is None:
            vision = NO_VISION if tuple(positions.shape) == (1, 1) else np.zeros(tuple(ids.shape[:2]), bool)
        values = (ids, weights, scores, vision)
        if not self._fast(("moe", path, ""), rows, positions, values) and not self._skipped("moe", path, positions):
            self._record("moe", path, "", rows, positions, values)

    def record_mhc(self, path, site, rows, positions, pre, post, comb, row_err, col_err) -> None:
        if site not in MHC_SITES:
            raise InputError(f"record_mhc: site must be one of {MHC_SITES}, got {site!r}")
        values = (pre, post, comb, row_err, col_err)
        if not self._fast(("mhc", path, site), rows, positions, values) and not self._skipped("mhc", path, positions):
            self._record("mhc", path, site, rows, positions, values)

    def record_engram(self, path, rows, positions, compressed_ids, row_ids, gates) -> None:
        values = (compressed_ids, row_ids, gates)
        if not self._fast(("engram", path, ""), rows, positions, values) and \
                not self._skipped("engram", path, positions):
            self._record("engram", path, "", rows, positions, values)

    def wants_attention(self, path: str) -> bool:
        a = self.budget.attention
        chosen = a if isinstance(a, bool) else (path in a or layer_path(path) in a)
        return chosen and self.budget.keeps_layer(path)

    def record_attention(self, path, rows, positions, topk, window_mass, compressed_mass, sink_mass) -> None:
        if not self.wants_attention(path):
            return
        values = (topk, window_mass, compressed_mass, sink_mass)
        if not self._fast(("attention", path, ""), rows, positions, values) and \
                not self._skipped("attention", path, positions):
            self._record("attention", path, "", rows, positions, values)

    def wants_lens(self, path: str) -> bool:
        """Whether the logit lens of a backbone layer ('layers.3') is recorded (budget.lens and its layers)."""
        return self.budget.lens and self.budget.keeps_layer(path)

    def record_lens(self, path, rows, positions, hidden, rms_in, rms_out, readout) -> None:
        """The logit lens of one layer: hidden [B, S, dim], the layer's output streams read out the way the model
        reads out its last layer (collapse, final norm); rms_in, rms_out [B, S, hc], each hc stream's RMS entering
        and leaving the layer. readout(hidden [N, dim]) -> logits [N, V]: the model's head. The hidden states are
        kept until the trace is read; then one batched head matmul turns them into the "lens" records (top-k,
        the next token's rank and probability) and they are dropped (engine.trace.lens)."""
        if not self.wants_lens(path):
            return
        self._lens_readout = readout
        values = (hidden, rms_in, rms_out)
        if not self._fast(("lens_hidden", path, ""), rows, positions, values):
            self._record("lens_hidden", path, "", rows, positions, values)

    def _fast(self, key: tuple[str, str, str], rows, positions, values: tuple) -> bool:
        """The decode fast path: a one-token call with the rows and positions tensors of the call before it (the
        layers of one forward), every layer kept and nothing staged, into columns that exist: copied in and True.
        False, with nothing recorded, sends the call down the checked path (_skipped, _record)."""
        last = self._last_call
        if last is None or last[0] is not positions or last[1] is not rows or last[7].single is None or \
                self._pending or self.budget.layers is not None or last[2] != self._slots.epoch or \
                last[3].tobytes() != last[4] or (last[5] is not None and last[5].tobytes() != last[6]):
            return False
        columns = self._columns.get(key)
        return columns is not None and columns.record_one(*last[7].single, values)

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

    def facts(self, kind: str):
        """Every record of a kind, ordered by (path depth, site, row, pos): (path, site, row, pos, fields)."""
        out = []
        for (_, path, site), columns in self._sorted(kind):
            order = columns.order()
            out.extend((path, site, row, pos, values) for row, pos, values in
                       zip(columns.rows[order].tolist(), columns.pos[order].tolist(), columns.entries(order)))
        return out

    def fact_columns(self, kind: str):
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

    def _record(self, kind: str, path: str, site: str, rows, positions, values: tuple) -> None:
        """Check the call's fields, admit its tokens under the budget and copy the kept ones into the columns: one
        numpy copy per field from a CPU tensor; from a GPU one non-blocking copy now, written at the next _flush."""
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
        (self._columns.get((kind, path, site)) or self._columns_for(kind, path, site)).record(call, arrays)

    def _stage(self, kind: str, path: str, site: str, rows, positions, call: CallTokens | None, values: tuple) -> None:
        self._check_fields(kind, path, tuple(positions.shape), values)
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
        if last is not None and last[0] is positions and last[1] is rows and last[2] == self._slots.epoch and \
                last[3].tobytes() == last[4] and (last[5] is None or last[5].tobytes() == last[6]):
            return last[7]
        return None

    def _admit(self, kind: str, path: str, rows, positions) -> CallTokens:
        """The call's tokens, admitted under the budget (remembered for the next call: see _known_call)."""
        b, s = self._call_shape(kind, path, positions)
        row_list = list(range(b)) if rows is None else host_int64(rows).reshape(-1).tolist()
        if len(row_list) != b:
            raise InputError(f"record_{kind}({path}): rows must be [B={b}], got {len(row_list)} rows")
        call = self._slots.admit(row_list, np.array(host_int64(positions).reshape(b, s)))  # a copy of its own
        pos_view = host_view(positions)
        rows_view = None if rows is None else host_view(rows)
        self._last_call = (positions, rows, self._slots.epoch, pos_view, pos_view.tobytes(), rows_view,
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

    def _flush(self) -> None:
        """Write the GPU records whose host copies were in flight into their columns, in arrival order."""
        if self._pending:
            pending, self._pending = self._pending, []
            for columns, call, staged in pending:
                columns.record(call, staged.arrays())

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
        """Before a read: write the GPU records in flight (the Trace also resolves its pending lens records)."""
        self._flush()

    def _filled(self) -> list[tuple[tuple[str, str, str], FactColumns]]:
        """((kind, path, site), columns) of every key that holds records."""
        self._settle()
        return [(key, columns) for key, columns in self._columns.items() if columns.n]
