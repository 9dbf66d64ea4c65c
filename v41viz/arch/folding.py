"""Fold the layer stack into groups of consecutive layers (or repeating layer pairs) with the same role."""
from __future__ import annotations

from dataclasses import dataclass

from engine.spec.roles import LayerRole


@dataclass(frozen=True)
class LayerGroup:
    id: str                       # "layers.3-7" (run), "layers.3-38" (repeating pattern) or "layers.5" (single)
    layers: tuple[int, ...]       # every layer index the group covers, in order
    period: int                   # 1: identical layers; 2: an alternating pair (V4's CSA/HCA)
    variants: tuple[str, ...]     # one role label per position in the period
    draft: bool

    @property
    def repeats(self) -> int:
        """The ×N badge: how many times the (period-long) unit repeats."""
        return len(self.layers) // self.period

    @property
    def first(self) -> int:
        return self.layers[0]

    @property
    def span(self) -> str:
        a, b = self.layers[0], self.layers[-1]
        return str(a) if a == b else f"{a}–{b}"

    @property
    def label(self) -> str:
        if self.draft:
            return self.id
        return f"layers {self.span}" + (f"  ×{self.repeats}" if self.repeats > 1 else "")


def signature(role: LayerRole) -> tuple:
    """What makes two layers draw the same: their role summary (sources included) and draft-ness."""
    return (role.summary, role.draft)


def fold_layers(roles: tuple[LayerRole, ...], n_backbone: int) -> list[LayerGroup]:
    """Greedy left-to-right folding of the backbone; draft stages stay separate (each owns other tensors)."""
    sigs = [signature(r) for r in roles[:n_backbone]]
    groups: list[LayerGroup] = []
    i = 0
    while i < len(sigs):
        best_period, best_len = 1, 1
        for period in (1, 2):
            unit = sigs[i:i + period]
            if len(unit) < period or (period == 2 and unit[0] == unit[1]):
                continue
            n = 0
            while sigs[i + n * period:i + (n + 1) * period] == unit:
                n += 1
            if n >= 2 and n * period > best_len:
                best_period, best_len = period, n * period
        layers = tuple(range(i, i + best_len))
        variants = tuple(roles[j].summary for j in layers[:best_period])
        gid = f"layers.{layers[0]}" if best_len == 1 else f"layers.{layers[0]}-{layers[-1]}"
        groups.append(LayerGroup(gid, layers, best_period, variants, draft=False))
        i += best_len
    for role in roles[n_backbone:]:
        groups.append(LayerGroup(role.path, (role.layer,), 1, (role.summary,), draft=True))
    return groups


def group_of(groups: list[LayerGroup], layer: int) -> LayerGroup:
    for g in groups:
        if layer in g.layers:
            return g
    raise KeyError(f"layer {layer} is in no group")
