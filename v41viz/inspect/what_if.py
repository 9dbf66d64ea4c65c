"""What-if reruns (no Streamlit): the changes offered for what a person looks at, the rerun's settings, and what the
change did: the log-probability of the baseline's tokens, and the experts each layer chose instead."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.request.interventions import KINDS, check_interventions, parse_intervention
from engine.request.schedules import SCHEDULES
from engine.trace import Trace

from .panel_style import thinned_categories, titled
from .run import GenSettings, LiveRun
from .run_diff import RunDiff
from .run_meta import interventions_of, settings_of
from .tokens import axis_labels, visible

KIND_LABELS = {"ban-expert": "ban an expert", "force-expert": "force an expert", "engram-off": "switch off Engram",
               "mhc-identity": "pin mHC to the identity", "no-candidate-filter": "skip the candidate filter",
               "drop-stage": "drop a DSpark stage"}
PANEL_KIND = {"Experts": "ban-expert", "Engram": "engram-off", "mHC": "mhc-identity", "DSpark": "drop-stage",
              "Attention": "no-candidate-filter"}   # the change the panel a person is looking at suggests
LAYER_KINDS = ("ban-expert", "force-expert", "engram-off", "mhc-identity")
EXPERT_KINDS = ("ban-expert", "force-expert")
SCOPES = {"token": "this token only", "onwards": "from this token on", "all": "every token"}
LOGPROB_COLUMNS = ["pos", "token", "baseline log p", "rerun log p", "change", "change at most", "compared"]
CHANGE_COLUMNS = ["layer", "pos", "token", "baseline experts", "rerun experts", "dropped", "added"]


@dataclass
class WhatIf:
    """A rerun of `baseline` with `changes` (intervention texts) added to its own; `run` is the rerun."""
    baseline: LiveRun
    run: LiveRun
    changes: tuple[str, ...]


def offered_kinds(used_dspark: bool) -> list[str]:
    """Every kind of change; dropping a drafter stage only for a run that used the drafter."""
    return [k for k in KINDS if k != "drop-stage" or used_dspark]


def layer_label(args, layer: int) -> str:
    """'layer 4 · Engram · learned router': what a layer offers to change."""
    role = args.roles[layer]
    bits = [f"layer {layer}"] + (["Engram"] if role.engram else [])
    bits.append("hash-routed (token id)" if role.hash_routed else "learned router")
    return " · ".join(bits)


def valid_layer(args, kind: str, layer: int) -> bool:
    role = args.roles[layer]
    return (not role.hash_routed) if kind in EXPERT_KINDS else role.engram if kind == "engram-off" else True


def default_layer(args, kind: str, looked_at: int | None) -> int:
    """The layer a person is looking at when the change can apply there, else the first layer where it can."""
    if looked_at is not None and 0 <= looked_at < args.n_layers and valid_layer(args, kind, looked_at):
        return looked_at
    return next((n for n in range(args.n_layers) if valid_layer(args, kind, n)), 0)


def looked_layer(view: dict[str, object]) -> tuple[int | None, int | None]:
    """(backbone layer, drafter stage) of the module a person is looking at: the module filter, else the panel's
    layer ('layers.3.ffn' → (3, None), 'mtp.1' → (None, 1))."""
    for value in (view.get("node"), view.get("layer")):
        parts = str(value or "").split(".")
        if len(parts) >= 2 and parts[1].isdigit():
            n = int(parts[1])
            return (n, None) if parts[0] == "layers" else (None, n) if parts[0] == "mtp" else (None, None)
    return None, None


def chosen_experts(trace: Trace, layer: int, pos: int, row: int = 0) -> list[tuple[int, float]]:
    """(expert, routing weight) the token at `pos` chose at backbone layer `layer`, heaviest first."""
    rec = trace.fact("moe", f"layers.{layer}.ffn", row, pos)
    if rec is None:
        return []
    pairs = [(int(e), float(w)) for e, w in zip(rec["ids"], rec["weights"])]
    return sorted(pairs, key=lambda p: -p[1])


def default_expert(kind: str, chosen: list[tuple[int, float]], n_experts: int) -> int:
    """Ban: the expert the token leaned on most. Force: the lowest-numbered expert it did not choose."""
    ids = [e for e, _ in chosen]
    if kind == "ban-expert" and ids:
        return ids[0]
    return next((e for e in range(n_experts) if e not in ids), 0)


def intervention_text(kind: str, layer: int | None, expert: int | None, pos: int, scope: str) -> str:
    """The text form of one change: 'ban-expert:3:5@12-' (scope: token | onwards | all)."""
    numbers = [n for n in (layer, expert) if n is not None]
    span = {"token": f"@{pos}", "onwards": f"@{pos}-", "all": ""}[scope]
    return ":".join([kind, *map(str, numbers)]) + span


def check_changes(changes, args) -> tuple[str, ...]:
    """The changes' canonical texts, checked against the model (InputError: the engine's sentence)."""
    return tuple(iv.text for iv in check_interventions(changes, args))


def rerun_settings(run: LiveRun, changes: tuple[str, ...]) -> GenSettings:
    """The baseline's prompt, settings and seed (from its trace) with `changes` added to its own changes."""
    recorded = settings_of(run.trace.meta)
    if recorded.get("schedule") not in SCHEDULES:
        recorded.pop("schedule", None)
    recorded["prompt"] = run.prompt
    merged = tuple(dict.fromkeys(interventions_of(run.trace.meta) + tuple(changes)))
    return GenSettings(**recorded, interventions=merged)


def first_position(changes: tuple[str, ...]) -> int:
    """The first token position any of the changes applies at (0 for a change on every token)."""
    return min((parse_intervention(t).first or 0 for t in changes), default=0)


def logprob_changes(a: Trace, b: Trace, shared_prefix: int, row: int = 0) -> pd.DataFrame:
    """Per position of the baseline (a): the log-probability of its token in each run and the change. While the
    texts agree both runs predicted that token from the same prefix. At the first divergence the prefix still
    agrees: the rerun's probability of the baseline's token comes from the rerun's recorded top-k; when it fell
    below that, only a bound is known (`change at most`: its probability is under the top-k's smallest). After
    the divergence the runs read different text, so nothing is compared."""
    theirs = {t.pos: t for t in b.tokens(row)}
    lines = []
    for t in a.tokens(row):
        other, mine, bound = theirs.get(t.pos), t.logprob, math.nan
        if other is None:
            rerun, how = math.nan, "the rerun ended before this position"
        elif t.pos < shared_prefix:
            rerun, how = other.logprob, "same text before and here"
        elif t.pos == shared_prefix:
            hit = other.top_probs[other.top_ids == t.token_id]
            rerun = float(np.log(hit[0])) if hit.size else math.nan
            how = "first divergence: from the rerun's top-k"
            if not hit.size and other.top_probs.size:
                bound = float(np.log(other.top_probs.min())) - mine
                how = (f"first divergence: below the rerun's top-{other.top_probs.size} "
                       f"(p < {other.top_probs.min():.3g})")
        else:
            rerun, how = math.nan, "after the divergence: different text before"
        if mine != mine and t.pos < shared_prefix:
            how = "no probability (nothing before the first token)" if t.pos == 0 else "not recorded"
        lines.append([t.pos, t.text, mine, rerun, rerun - mine, bound, how])
    return pd.DataFrame(lines, columns=LOGPROB_COLUMNS)


def logprob_figure(changes: pd.DataFrame, a: Trace, start: int, divergence: int | None, row: int = 0) -> go.Figure:
    """Bars of the change in the baseline token's log-probability per position up to the first divergence (a grey
    bar: a bound, where the baseline's token fell below the rerun's top-k), with the first position the change
    applies at and the divergence marked."""
    shown = changes if divergence is None else changes[changes["pos"] <= divergence]
    positions = shown["pos"].tolist()
    x = axis_labels(a, row, positions)
    y = shown["change"].to_numpy(float)
    hover = "%{x}: %{y:.4f} nats<br>%{customdata[0]}<extra></extra>"
    fig = go.Figure(go.Bar(x=x, y=y, marker_color=["#b2182b" if v < 0 else "#2166ac" for v in np.nan_to_num(y)],
                           customdata=shown[["compared"]].to_numpy(), hovertemplate=hover, name="change"))
    if shown["change at most"].notna().any():
        fig.add_bar(x=x, y=shown["change at most"].to_numpy(float), marker_color="#9ca3af",
                    marker_pattern_shape="/", name="at most (below the rerun's top-k)",
                    customdata=shown[["compared"]].to_numpy(), hovertemplate=hover.replace(": %", ": at most %"))
    marks = []
    for pos, label, dash in ((start, "dotted: the change applies from here", "dot"),
                             (divergence, "dashed: the texts diverge", "dash")):
        if pos is not None and pos in positions:
            fig.add_vline(x=positions.index(pos) - 0.5, line_dash=dash, line_color="#6b7280")
            marks.append(label)
    fig.update_layout(yaxis_title="Δ log p (nats)", xaxis_title=" · ".join(["the baseline's token", *marks]),
                      barmode="overlay")
    tail = "" if divergence is None else f" · positions 0–{divergence}; after the divergence nothing is compared"
    bounded = len(fig.data) > 1
    fig.update_layout(showlegend=bounded)
    titled(fig, f"change in the log-probability of the baseline's token (rerun − baseline){tail}", height=320,
           legend=bounded)
    return thinned_categories(fig, x)


def routing_changes(diff: RunDiff, a: Trace, row: int = 0) -> pd.DataFrame:
    """Every (layer, token) of the shared text whose experts differ between the runs: which were dropped, added."""
    r = diff.routing
    texts = {t.pos: visible(t.text) for t in a.tokens(row)}
    lines = []
    for line in r[r["same input"].astype(bool)].to_dict("records"):
        before, after = list(line["A experts"]), list(line["B experts"])
        if before != after:
            lines.append([line["layer"], int(line["pos"]), texts.get(int(line["pos"]), "?"), before, after,
                          sorted(set(before) - set(after)), sorted(set(after) - set(before))])
    return pd.DataFrame(lines, columns=CHANGE_COLUMNS)


def routing_by_layer(diff: RunDiff, changes: pd.DataFrame) -> pd.DataFrame:
    """Per backbone MoE layer: tokens of the shared text compared, how many chose other experts, and from where."""
    r = diff.routing[diff.routing["same input"].astype(bool)]
    lines = []
    for layer in dict.fromkeys(r["layer"]):
        mine = changes[changes["layer"] == layer]
        lines.append([layer, int((r["layer"] == layer).sum()), len(mine),
                      str(int(mine["pos"].min())) if len(mine) else "–"])
    return pd.DataFrame(lines, columns=["layer", "tokens compared", "chose other experts", "first at position"])


def position_that_matters(trace: Trace, pos: int) -> tuple[int, str]:
    """The position a what-if change starts at, and why it is not the selected one. The page selects the last token
    the model read; its output chose only the run's final token, so a change there, even "from it on", can move at
    most that one token (often none: "30 of 30 agree"). Then the change starts at the last prompt token, whose
    output chose the first new token, so that it can reach every generated token."""
    toks = trace.tokens(0)
    prompt = [t.pos for t in toks if not t.generated]
    if not toks or not prompt:
        return pos, ""
    final = max(t.pos for t in toks)          # sampled, never read back: the run ended there
    if pos < final - 1 or pos <= prompt[-1]:
        return pos, ""
    start = prompt[-1]
    return start, (f"The selected token (position {pos}) is the last the model read: its output chose only the "
                   f"run's final token, so a change from there could move at most that one token. The change starts "
                   f"at position {start}, the last prompt token, whose output chose the first new token, so that it "
                   "can reach every generated token; pick another token above to start elsewhere.")
