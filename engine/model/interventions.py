"""Interventions as the forward reads them: per layer and position, which change applies (masks over [B, S])."""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ..request.interventions import Intervention, check_interventions
from ..spec.config import ModelArgs


class Interventions:
    """Checked interventions (engine.request.interventions) with the lookups the model's modules make. Each lookup
    takes the call's absolute positions [B, S] and returns a bool mask [B, S] of where the change applies, or None
    when no intervention of that kind names this layer (the module then runs as the reference, untouched)."""

    def __init__(self, items: tuple[Intervention, ...] = ()) -> None:
        self.items = items

    @classmethod
    def of(cls, items: Interventions | Iterable[Intervention | str] | None, args: ModelArgs) -> Interventions:
        """From checked items, or texts / Interventions checked against the config `args` (InputError)."""
        if isinstance(items, Interventions):
            return items
        return cls(check_interventions(items or (), args)) if items else NONE

    def __bool__(self) -> bool:
        return bool(self.items)

    @property
    def texts(self) -> list[str]:
        """The canonical texts, in the order given (what a trace's meta records)."""
        return [iv.text for iv in self.items]

    def names(self, kind: str, layer: int | None = None) -> bool:
        """Whether any intervention of `kind` names this layer (stage, for drop-stage) at any position."""
        return any(iv.kind == kind and iv.layer == layer for iv in self.items)

    def mask(self, kind: str, layer: int | None, positions: torch.Tensor) -> torch.Tensor | None:
        """[B, S] bool: the positions where an intervention of `kind` at `layer` applies; None if none names it."""
        found = [iv for iv in self.items if iv.kind == kind and iv.layer == layer]
        if not found:
            return None
        out = torch.zeros(positions.shape, dtype=torch.bool, device=positions.device)
        for iv in found:
            out |= covered(iv, positions)
        return out

    def engram_off(self, layer: int, positions: torch.Tensor) -> torch.Tensor | None:
        return self.mask("engram-off", layer, positions)

    def mhc_identity(self, layer: int, positions: torch.Tensor) -> torch.Tensor | None:
        return self.mask("mhc-identity", layer, positions)

    def candidate_filter_off(self, positions: torch.Tensor) -> torch.Tensor | None:
        return self.mask("no-candidate-filter", None, positions)

    def stage_dropped(self, stage: int, positions: torch.Tensor) -> torch.Tensor | None:
        return self.mask("drop-stage", stage, positions)

    def expert_steer(self, layer: int, positions: torch.Tensor, n_experts: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        """[B, S, E] added to the router's selection scores before its top-k: −inf for a banned expert, +inf for
        a forced one, 0 elsewhere; None when no ban or force names this layer."""
        found = [iv for iv in self.items if iv.kind in ("ban-expert", "force-expert") and iv.layer == layer]
        if not found:
            return None
        steer = torch.zeros(*positions.shape, n_experts, dtype=dtype, device=positions.device)
        for iv in found:
            value = float("-inf") if iv.kind == "ban-expert" else float("inf")
            steer[..., iv.expert] = steer[..., iv.expert].masked_fill(covered(iv, positions), value)
        return steer


def covered(iv: Intervention, positions: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: the positions inside iv's range first..last."""
    if iv.first is None:
        return torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
    inside = positions >= iv.first
    return inside if iv.last is None else inside & (positions <= iv.last)


NONE = Interventions()
