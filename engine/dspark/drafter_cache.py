"""DrafterCache: each draft stage's ring of tapped target features (spec §7), with exact rollback."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..model.draft import main_features
from ..spec.errors import InputError


def tapped_ring_rows(model, taps: torch.Tensor, positions: torch.Tensor, quant_sim: bool) -> list[torch.Tensor]:
    """The target's taps [B, S, n_taps·dim] at absolute positions [B, S] → each draft stage's ring rows
    [B, S, head_dim] in the model's dtype (spec §7: main_x through the stage's kv projection, norm and RoPE)."""
    main_x = main_features(model, taps)                                      # [B, S, dim]
    return [stage.attn.ring_kv(main_x, positions, quant_sim).to(model.dtype) for stage in model.mtp]


class DrafterCache:
    """Per row b, `pos[b]` = the next position whose target features the rings will take, and for every draft
    stage a ring [R, window + margin, head_dim] of main_kv rows at slot = position % slots. The drafter reads
    the last `window` positions; the `margin` spare slots keep the newest positions restorable, so features
    of a whole verified block can be written and the rejected part rolled back, as in the target cache.

    `block_rows` = (S, f): appends of S positions (a verify block's) compute their ring rows with f, a compiled
    tapped_ring_rows (engine.graphs.compiled_body.compiled_ring_rows); other widths (prefill, catch-up) run eagerly."""

    def __init__(self, model, batch_size: int, margin: int, block_rows: tuple[int, Callable] | None = None):
        args = model.args
        if not args.has_dspark:
            raise InputError(f"config '{args.name or args.model_type}' has no DSpark drafter (dspark_block_size 0)")
        self.window, self.margin = args.window_size, margin
        self.slots = args.window_size + margin
        self.batch_size = batch_size
        self.quant_sim = model.options.quant_sim
        self.pos = torch.zeros(batch_size, dtype=torch.long)
        self.high_water = torch.zeros(batch_size, dtype=torch.long)
        self.rings = {st.attn.layer: torch.zeros(batch_size, self.slots, args.head_dim, dtype=model.dtype,
                                                 device=model.device) for st in model.mtp}
        self.block_rows = block_rows
        self.deferred: dict[int, list[torch.Tensor]] = {}   # row → taps [1, s, n_taps·dim] not yet in its rings
        self.skipped: dict[int, int] = {}                    # row → deferred positions dropped (never read)
        self.held_positions: dict[int, int] = {}             # row → positions in its deferred taps

    def _rows(self, rows) -> torch.Tensor:
        rows = torch.as_tensor(rows, dtype=torch.long).flatten().cpu()
        if rows.numel() and (rows.min() < 0 or rows.max() >= self.batch_size):
            raise InputError(f"rows {rows.tolist()} outside the drafter cache's 0..{self.batch_size - 1}")
        return rows

    def _current(self, rows: torch.Tensor) -> torch.Tensor:
        """rows, refused if one of them has deferred taps (its rings lag behind pos until catch_up)."""
        if self.deferred and any(r in self.deferred for r in rows.tolist()):
            raise InputError(f"drafter rows {sorted(set(rows.tolist()) & set(self.deferred))} have deferred taps: "
                             "catch_up first")
        return rows

    def append(self, model, taps: torch.Tensor, rows) -> None:
        """Take the target's taps [B, S, n_taps·dim] for positions pos[row] .. pos[row] + S − 1 of each row."""
        rows = self._current(self._rows(rows))
        B, S, _ = taps.shape
        if rows.numel() != B:
            raise InputError(f"append: {B} rows of taps for {rows.numel()} cache rows")
        keep = min(S, self.slots)  # older positions would be overwritten inside this very write
        positions = self.pos[rows].unsqueeze(1) + torch.arange(S - keep, S)   # [B, keep]
        dev = taps.device
        compute = tapped_ring_rows
        if self.block_rows is not None and keep == self.block_rows[0]:
            compute = self.block_rows[1]
        kv_rows = compute(model, taps[:, S - keep:], positions.to(dev), self.quant_sim)   # per stage [B, keep, D]
        slot = (positions % self.slots).to(dev)
        for stage, kv in zip(model.mtp, kv_rows):
            self.rings[stage.attn.layer][rows.to(dev).unsqueeze(1), slot] = kv
        self.pos[rows] += S
        self.high_water[rows] = torch.maximum(self.high_water[rows], self.pos[rows])

    def defer(self, taps: torch.Tensor, rows) -> None:
        """Keep the taps [B, S, n_taps·dim] of positions pos[row] .. pos[row] + S − 1 for catch_up: a plain step's
        (the auto schedule's fallback), which no draft reads before the next drafting step, whose catch_up then
        writes them in one append. Only the newest `slots` positions of a row are kept: the older ones would be
        overwritten by that append and are never read or restored."""
        rows = self._rows(rows)
        if rows.numel() != taps.size(0):
            raise InputError(f"defer: {taps.size(0)} rows of taps for {rows.numel()} cache rows")
        for i, r in enumerate(rows.tolist()):
            held = self.deferred.setdefault(r, [])
            held.append(taps[i:i + 1])
            count = self.held_positions.get(r, 0) + taps.size(1)
            while count - held[0].size(1) >= self.slots:
                dropped = held.pop(0).size(1)
                self.skipped[r] = self.skipped.get(r, 0) + dropped
                count -= dropped
            self.held_positions[r] = count

    def catch_up(self, model, rows) -> None:
        """Append the deferred taps of these rows (a no-op for rows without any); read() and rollback() need it."""
        for r in self._rows(rows).tolist():
            held = self.deferred.pop(r, None)
            if held is not None:
                del self.held_positions[r]
                self.pos[r] += self.skipped.pop(r, 0)
                self.append(model, torch.cat(held, 1), [r])

    def rollback(self, pos, rows) -> None:
        """Forget the features of positions >= pos (per row); ring slots of older positions are untouched."""
        rows = self._current(self._rows(rows))
        target = torch.as_tensor(pos, dtype=torch.long).cpu().expand(rows.shape)
        for b, r in enumerate(rows.tolist()):
            t = int(target[b])
            if t < 0 or t > int(self.pos[r]):
                raise InputError(f"cannot roll drafter row {r} back to position {t}: it is at {int(self.pos[r])}")
            if t < int(self.high_water[r]) - self.margin:
                raise InputError(f"cannot roll drafter row {r} back to position {t}: only the last {self.margin} "
                                 f"positions below {int(self.high_water[r])} are restorable")
        self.pos[rows] = target

    def read(self, rows) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """(rings {layer: [B, slots, D]}, ring_index [B, window]) for rows whose next position is pos[row]:
        the slots of positions pos − window .. pos − 1 (−1 before the sequence start)."""
        rows = self._current(self._rows(rows))
        index = self.ring_index(rows)
        dev = next(iter(self.rings.values())).device
        return {layer: ring[rows.to(dev)] for layer, ring in self.rings.items()}, index.to(dev)

    def ring_index(self, rows) -> torch.Tensor:
        """[B, window] (CPU) the ring slots of positions pos − window .. pos − 1 of each row (−1 before the
        sequence start): what read() hands the drafter, computed on the host (a graphed draft's static input)."""
        rows = self._rows(rows)
        k = self.pos[rows].unsqueeze(1) - self.window + torch.arange(self.window)  # [B, window] positions
        return torch.where(k >= 0, k % self.slots, -1)

    def live_state(self, row: int) -> dict[str, torch.Tensor]:
        """What the next draft of this row reads, addressed by position (ring slots resolved)."""
        p = int(self.pos[row])
        slots = torch.tensor([t % self.slots for t in range(max(0, p - self.window), p)], dtype=torch.long)
        out = {"pos": self.pos[row].clone()}
        for layer, ring in self.rings.items():
            out[f"ring.{layer}"] = ring[row, slots.to(ring.device)]
        return out
