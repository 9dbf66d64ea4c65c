"""Two traces compared (two models, two prompts, a run with and without an intervention): tokens, routing, layers."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.dspark.metrics import DSparkMetrics, summarize
from engine.trace import Trace

from .layer_facts import load_entropy, mean_gate, mhc_gains
from .trace_model import trace_model

RANDOM_WEIGHTS = "random init"   # how Engine.source (the trace's meta "weights") names seeded random weights
HASH_ROUTER, LEARNED_ROUTER = "hash-routed (token id)", "learned"
TOKEN_COLUMNS = ["part", "index", "A pos", "A id", "A text", "B pos", "B id", "B text", "same"]
ROUTING_COLUMNS = ["layer", "pos", "A experts", "B experts", "overlap", "jaccard", "same input"]


@dataclass(frozen=True)
class RunFacts:
    """One side of a diff: the model that recorded the trace, its weights and what it produced."""
    model: str
    weights: str
    prompt: str
    n_prompt_tokens: int
    n_generated: int
    n_routed_experts: int
    n_activated_experts: int
    n_hash_layers: int
    dspark: DSparkMetrics | None     # None when the run did not use DSpark

    @property
    def random_weights(self) -> bool:
        return self.weights.startswith(RANDOM_WEIGHTS)


@dataclass(frozen=True)
class TokenAlignment:
    """Tokens are compared by their text, so that models with different vocabularies (a reduced-vocabulary
    checkpoint) still line up; prompt tokens pair by prompt index, generated tokens by generated index."""
    table: pd.DataFrame               # TOKEN_COLUMNS: one line per prompt index, then per generated index
    prompt_same: bool
    shared_prefix: int                # leading positions whose tokens agree: both models saw the same input there
    first_divergence: int | None      # the position where the token sequences first differ (None: identical)
    generated_compared: int           # generated indices both runs reached
    generated_agree: int              # of those, how many hold the same token
    first_generated_divergence: int | None  # 0 = the first new token (None: identical, same length)


@dataclass(frozen=True)
class RunDiff:
    a: RunFacts
    b: RunFacts
    tokens: TokenAlignment
    routing_comparable: bool
    routing_note: str                 # why routing is not comparable, or what the agreement means
    routing: pd.DataFrame             # ROUTING_COLUMNS: backbone MoE layers both have × positions both recorded
    routing_agreement: float          # mean Jaccard over same-input tokens (NaN: none, or not comparable)
    routing_agreement_all: float      # mean Jaccard over every token both recorded
    chance_agreement: float           # the mean Jaccard of independent uniform choices of k experts
    layers: pd.DataFrame              # one line per backbone layer of either run, facts side by side
    dspark: pd.DataFrame              # per draft position: conditional acceptance of A and B (empty: neither)
    dspark_note: str


def run_facts(trace: Trace, row: int = 0) -> RunFacts:
    tokens = trace.tokens(row)
    model = trace_model(trace)
    steps = [s for s in trace.dspark_steps if s.row == row]
    return RunFacts(model=model.name, weights=str(trace.meta.get("weights", "")),
                    prompt=str(trace.meta.get("prompt", "")),
                    n_prompt_tokens=sum(not t.generated for t in tokens), n_generated=sum(t.generated for t in tokens),
                    n_routed_experts=model.n_routed_experts, n_activated_experts=model.n_activated_experts,
                    n_hash_layers=model.n_hash_layers, dspark=summarize(steps) if steps else None)


def align_tokens(a: Trace, b: Trace, row: int = 0) -> TokenAlignment:
    ta, tb = a.tokens(row), b.tokens(row)
    shared = 0
    while shared < min(len(ta), len(tb)) and ta[shared].text == tb[shared].text:
        shared += 1
    first = None if shared == len(ta) == len(tb) else shared
    lines = []
    for part, generated in (("prompt", False), ("generated", True)):
        sa, sb = [t for t in ta if t.generated == generated], [t for t in tb if t.generated == generated]
        for i in range(max(len(sa), len(sb))):
            x, y = (sa[i] if i < len(sa) else None), (sb[i] if i < len(sb) else None)
            lines.append([part, i, *_token_cells(x), *_token_cells(y),
                          x is not None and y is not None and x.text == y.text])
    table = pd.DataFrame(lines, columns=TOKEN_COLUMNS)
    gen = table[table["part"] == "generated"]
    compared = int(min((gen["A pos"] >= 0).sum(), (gen["B pos"] >= 0).sum()))
    differs = gen.index[~gen["same"]]
    first_gen = None if not len(differs) else int(gen.loc[differs[0], "index"])
    prompt = table[table["part"] == "prompt"]
    return TokenAlignment(table, bool(prompt["same"].all()), shared, first,
                          compared, int(gen["same"].iloc[:compared].sum()), first_gen)


def _token_cells(t) -> tuple[int, int, str]:
    return (-1, -1, "") if t is None else (t.pos, t.token_id, t.text)


def chance_jaccard(n_experts: int, k_a: int, k_b: int) -> float:
    """Expected Jaccard overlap of a uniform random k_a-subset and an independent k_b-subset of n experts:
    the hypergeometric law of their intersection j, each weighted by j / (k_a + k_b − j)."""
    if n_experts <= 0 or k_a <= 0 or k_b <= 0 or max(k_a, k_b) > n_experts:
        return math.nan
    total = math.comb(n_experts, k_b)
    return sum(math.comb(k_a, j) * math.comb(n_experts - k_a, k_b - j) / total * j / (k_a + k_b - j)
               for j in range(1, min(k_a, k_b) + 1))


def backbone_moe(trace: Trace, row: int) -> dict[tuple[int, int], np.ndarray]:
    """(layer number, position) → the chosen expert ids, for the backbone's MoE layers (not the draft stages,
    whose expert sets differ from the backbone's in V4.1)."""
    return {(int(p.split(".")[1]), pos): v[0] for p, _, r, pos, v in trace.facts("moe")
            if r == row and p.startswith("layers.")}


def routing_frame(a: Trace, b: Trace, shared_prefix: int, row: int = 0) -> pd.DataFrame:
    """Per backbone layer both runs have and position both recorded: each run's experts and their Jaccard overlap;
    `same input` when every token up to that position agrees (both models saw the same text)."""
    ma, mb = backbone_moe(a, row), backbone_moe(b, row)
    lines = []
    for layer, pos in sorted(ma.keys() & mb.keys()):
        x, y = {int(e) for e in ma[layer, pos]}, {int(e) for e in mb[layer, pos]}
        overlap = len(x & y)
        lines.append([f"layers.{layer}.ffn", pos, sorted(x), sorted(y), overlap,
                      overlap / len(x | y) if x | y else math.nan, pos < shared_prefix])
    return pd.DataFrame(lines, columns=ROUTING_COLUMNS)


def layer_frame(a: Trace, b: Trace, routing: pd.DataFrame, row: int = 0) -> pd.DataFrame:
    """One line per backbone layer of either run: router kind, load entropy, mean Engram gate and mHC gain of each,
    and the mean routing agreement of the layer (same-input tokens, then all tokens both recorded)."""
    sides = []
    for trace in (a, b):
        facts = trace_model(trace)
        moe = {int(p.split(".")[1]): p for p in trace.paths("moe") if p.startswith("layers.")}
        engram = {int(p.split(".")[1]): p for p in trace.paths("engram") if p.startswith("layers.")}
        sides.append((trace, facts, moe, engram, mhc_gains(trace, row)))
    numbers = sorted(set().union(*(set(s[2]) | set(s[3]) | set(s[4]) for s in sides)))
    lines = []
    for n in numbers:
        line: dict[str, object] = {"layer": f"layers.{n}"}
        for side, (trace, facts, moe, engram, gains) in zip("AB", sides):
            router = "" if n not in moe else HASH_ROUTER if n < facts.n_hash_layers else LEARNED_ROUTER
            line[f"{side} router"] = router or ("no MoE record" if n in gains else "not in this run")
            line[f"{side} load entropy (bits)"] = load_entropy(trace, moe[n], facts.n_routed_experts) \
                if n in moe else math.nan
            line[f"{side} Engram gate"] = mean_gate(trace, engram[n], row) if n in engram else math.nan
            line[f"{side} mHC gain"] = gains.get(n, math.nan)
        mine = routing[routing["layer"] == f"layers.{n}.ffn"]
        same = mine[mine["same input"]]
        line["agreement (same input)"] = float(same["jaccard"].mean()) if len(same) else math.nan
        line["agreement (all tokens)"] = float(mine["jaccard"].mean()) if len(mine) else math.nan
        lines.append(line)
    return pd.DataFrame(lines)


def dspark_frame(a: RunFacts, b: RunFacts) -> tuple[pd.DataFrame, str]:
    """Per draft position k: P(draft k accepted | drafts before it accepted) of each run that used DSpark."""
    used = {side: f.dspark for side, f in (("A", a), ("B", b)) if f.dspark is not None}
    if not used:
        return pd.DataFrame(columns=["draft position"]), "Neither run used DSpark."
    gamma = max(len(m.conditional_acceptance) for m in used.values())
    table = pd.DataFrame({"draft position": range(1, gamma + 1)})
    for side, m in used.items():
        values = m.conditional_acceptance + [math.nan] * (gamma - len(m.conditional_acceptance))
        table[f"{side} acceptance"] = values
    if len(used) == 1:
        (side,) = used
        return table, f"Only {side} used DSpark (the other model has no drafter, or DSpark was off for it)."
    return table, ""


def diff_traces(a: Trace, b: Trace, row: int = 0) -> RunDiff:
    """Everything the Compare page shows about two runs; any pair of traces, of any models."""
    fa, fb = run_facts(a, row), run_facts(b, row)
    tokens = align_tokens(a, b, row)
    comparable = fa.n_routed_experts == fb.n_routed_experts > 0
    if not fa.n_routed_experts or not fb.n_routed_experts:
        note = "not comparable: a run recorded no routing"
    elif not comparable:
        note = (f"not comparable: A has {fa.n_routed_experts} routed experts and B {fb.n_routed_experts}, so an "
                "expert id names different slots in the two models")
    elif fa.model != fb.model or fa.weights != fb.weights:
        note = ("the two runs have different weights, so expert e of A and expert e of B are different parameters: "
                "agreement measures coincidence, to be read against the chance level")
    else:
        note = "the same model and weights: agreement below 1 comes from different inputs or an intervention"
    routing = routing_frame(a, b, tokens.shared_prefix, row) if comparable else \
        pd.DataFrame(columns=ROUTING_COLUMNS)
    same = routing[routing["same input"].astype(bool)]
    dspark, dspark_note = dspark_frame(fa, fb)
    return RunDiff(fa, fb, tokens, comparable, note, routing,
                   float(same["jaccard"].mean()) if len(same) else math.nan,
                   float(routing["jaccard"].mean()) if len(routing) else math.nan,
                   chance_jaccard(fa.n_routed_experts, fa.n_activated_experts, fb.n_activated_experts)
                   if comparable else math.nan,
                   layer_frame(a, b, routing, row), dspark, dspark_note)
