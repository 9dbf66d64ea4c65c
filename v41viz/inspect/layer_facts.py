"""Per-layer facts of one run, over all tokens or at one position (shared by the run diff and the overlay)."""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from engine.dspark.metrics import summarize
from engine.trace import DSparkStep, Trace, mhc_gain


def layer_number(path: str) -> int:
    """'layers.3.ffn' → 3, 'mtp.1' → 1."""
    return int(path.split(".")[1])


def load_violation(trace: Trace, path: str, n_experts: int) -> float:
    """max/mean − 1 of a layer's expert load over the recorded tokens: 0 when every expert gets the same share, E/k − 1
    when every token picks the same k experts (NaN: no routing recorded)."""
    load = trace.expert_load(path, n_experts or None).astype(np.float64)
    if load.sum() <= 0:
        return math.nan
    return float(load.max() / load.mean() - 1.0)


def load_entropy(trace: Trace, path: str, n_experts: int) -> float:
    """Entropy in bits of a layer's expert load over the recorded tokens: log2(E) when every expert gets the same
    share, lower when routing concentrates on a few experts."""
    load = trace.expert_load(path, n_experts or None).astype(np.float64)
    if load.sum() <= 0:
        return math.nan
    return entropy_bits(load)


def entropy_bits(weights: np.ndarray) -> float:
    """Entropy in bits of non-negative weights normalised to sum 1 (NaN when they sum to 0)."""
    w = np.asarray(weights, np.float64).reshape(-1)
    if w.sum() <= 0:
        return math.nan
    p = w[w > 0] / w.sum()
    return float(-(p * np.log2(p)).sum()) + 0.0


def token_routing(trace: Trace, path: str, row: int, pos: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The experts a token chose at a MoE layer and their routing weights, in the router's order (None: not
    recorded)."""
    rec = trace.fact("moe", path, row, pos)
    if rec is None:
        return None
    return rec["ids"].reshape(-1), rec["weights"].reshape(-1).astype(np.float64)


def mean_gate(trace: Trace, path: str, row: int, pos: int | None = None) -> float:
    """The Engram gate of a layer averaged over the streams and the recorded tokens (or at one position)."""
    if pos is not None:
        rec = trace.fact("engram", path, row, pos)
        return math.nan if rec is None else float(np.mean(rec["gates"]))
    gates = [float(np.mean(v[2])) for p, _, r, _, v in trace.facts("engram") if p == path and r == row]
    return float(np.mean(gates)) if gates else math.nan


def _backbone_positions(trace: Trace, row: int) -> list[int]:
    return sorted({pos for p, _, r, pos, _ in trace.facts("mhc") if r == row and p.startswith("layers.")})


def _seam_products(trace: Trace, row: int, pos: int | None) -> Iterator[tuple[int, str, str, float]]:
    """(position, layer path, site, gain of the composite product after that seam) for every recorded backbone
    seam, at one position or at every recorded one."""
    for at in (_backbone_positions(trace, row) if pos is None else [pos]):
        for path, site, product in trace.mhc_products(row, at):
            yield at, path, site, mhc_gain(product)


def seam_gains(trace: Trace, row: int, pos: int | None = None) -> dict[tuple[str, str], float]:
    """(layer path, 'attn' | 'ffn') → the gain of the composite mHC mixing after that seam (the product of every
    backbone seam up to it), averaged over the recorded positions or at one position."""
    per_seam: dict[tuple[str, str], list[float]] = {}
    for _, path, site, gain in _seam_products(trace, row, pos):
        per_seam.setdefault((path, site), []).append(gain)
    return {seam: float(np.mean(g)) for seam, g in per_seam.items()}


def mhc_gains(trace: Trace, row: int, pos: int | None = None) -> dict[int, float]:
    """Backbone layer number → the composite mHC gain after the layer's last seam, averaged over positions (or at
    one position)."""
    per_layer: dict[int, list[float]] = {}
    after: dict[tuple[int, int], float] = {}
    for at, path, _, gain in _seam_products(trace, row, pos):
        after[(at, layer_number(path))] = gain   # the later seam of a layer overwrites the earlier one
    for (_, layer), gain in after.items():
        per_layer.setdefault(layer, []).append(gain)
    return {layer: float(np.mean(g)) for layer, g in sorted(per_layer.items())}


def attention_mass(trace: Trace, path: str, row: int, pos: int | None = None) -> tuple[float, float, float] | None:
    """Mean (window, compressed, sink) attention mass of a layer over the recorded tokens, or at one position;
    None when the run did not record attention there (it is opt-in)."""
    if pos is not None:
        rec = trace.fact("attention", path, row, pos)
        return None if rec is None else (float(rec["window_mass"]), float(rec["compressed_mass"]),
                                         float(rec["sink_mass"]))
    values = [(float(v[1]), float(v[2]), float(v[3])) for p, _, r, _, v in trace.facts("attention")
              if p == path and r == row]
    if not values:
        return None
    win, comp, sink = np.mean(values, axis=0)
    return float(win), float(comp), float(sink)


def acceptance_by_position(trace: Trace, row: int) -> list[float]:
    """Per draft position k: P(draft k accepted | drafts before it accepted), over the row's DSpark steps ([] when
    the run did not use DSpark)."""
    steps = [s for s in trace.dspark_steps if s.row == row]
    return summarize(steps).conditional_acceptance if steps else []


def committing_step(trace: Trace, row: int, pos: int) -> DSparkStep | None:
    """The DSpark step that committed the token at `pos` (its accepted drafts and the target's token follow the
    anchor), or None (a prompt token, or a run without DSpark)."""
    return next((s for s in trace.dspark_steps
                 if s.row == row and s.anchor_pos < pos <= s.anchor_pos + s.accepted + 1), None)


def step_outcomes(step: DSparkStep) -> list[float]:
    """Per draft position of one step: 1 accepted, 0 the rejected one, NaN not verified (after a rejection, or beyond
    the verified length): the per-step terms whose mean over steps is acceptance_by_position."""
    out = []
    for k in range(len(step.drafted)):
        out.append(1.0 if k < step.accepted else 0.0 if k == step.accepted < step.verify_len else math.nan)
    return out
