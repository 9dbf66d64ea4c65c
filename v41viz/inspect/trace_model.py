"""The model that made a trace, as far as the panels need it, read from the trace alone: expert counts, Engram
n-gram orders and token texts. A replay is drawn against the model that recorded it, never the one loaded now."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from engine.trace import Trace

TEXTS = "token_texts"   # meta key: {str(token id): text} for ids a trace names without their text


@dataclass(frozen=True)
class TraceModel:
    name: str
    n_routed_experts: int        # 0 when the trace has no MoE records
    n_activated_experts: int
    engram_max_ngram_size: int   # 0 when unknown (the hashed rows are then listed without orders)
    n_hash_layers: int = 0       # V4: the first n MoE layers route by a token-id table (tid2eid), not by scores


def model_facts(args) -> dict[str, int]:
    """What a run writes into its trace's meta so that a replay needs no loaded model."""
    return {"n_routed_experts": int(args.n_routed_experts), "n_activated_experts": int(args.n_activated_experts),
            "engram_max_ngram_size": int(args.engram_max_ngram_size), "n_hash_layers": int(args.n_hash_layers),
            "vocab_size": int(args.vocab_size)}   # engine.trace.decode refuses a token id at or beyond it


def trace_model(trace: Trace) -> TraceModel:
    """The recording model's sizes: from the meta a run wrote, else inferred from the records (the largest expert
    id seen + 1 is a lower bound on the expert count, and says so by being what the charts show)."""
    meta = trace.meta
    moe = trace.facts("moe")
    seen_experts = max((int(v[0].max()) + 1 for *_, v in moe if v[0].size), default=0)
    seen_k = max((int(v[0].shape[0]) for *_, v in moe), default=0)
    experts = max(_int(meta.get("n_routed_experts")), seen_experts)
    k = _int(meta.get("n_activated_experts")) or seen_k
    ngram = _int(meta.get("engram_max_ngram_size"))
    rows = next((v[1].size for *_, v in trace.facts("engram")), 0)
    if ngram < 2 or (rows and rows % (ngram - 1)):
        ngram = 0
    return TraceModel(str(meta.get("config", "")), experts, k, ngram, _int(meta.get("n_hash_layers")))


def record_texts(trace: Trace, token_text: Callable[[int], str]) -> None:
    """Store the text of every id the trace names without text (top-k alternatives, DSpark drafts, the logit
    lens's top tokens), so that a
    saved trace shows them wherever it is replayed."""
    ids = {int(i) for r in trace.rows() for t in trace.tokens(r) for i in t.top_ids.tolist()}
    ids |= {int(i) for *_, values in trace.facts("lens") for i in values[0].tolist()}   # each layer's top tokens
    for s in trace.dspark_steps:
        ids |= {int(s.anchor_token), int(s.next_token), *(int(i) for i in s.drafted.tolist())}
    texts = dict(trace.meta.get(TEXTS) or {})
    own = {t.token_id for r in trace.rows() for t in trace.tokens(r)}
    for i in sorted(ids - own - {int(k) for k in texts if _is_id(k)}):
        try:
            texts[str(i)] = token_text(i)
        except (IndexError, KeyError, ValueError):
            continue
    trace.meta[TEXTS] = texts


def text_lookup(trace: Trace, fallback: Callable[[int], str] | None = None) -> Callable[[int], str | None]:
    """id → text: the trace's own texts (its tokens, then the stored ones), then `fallback` (the tokenizer of
    the same model, when it is loaded), else None. Never raises for an id of another vocabulary."""
    known: dict[int, str] = {}
    stored = trace.meta.get(TEXTS)
    if isinstance(stored, dict):
        for k, v in stored.items():
            if _is_id(k) and isinstance(v, str):
                known[int(k)] = v
    for r in trace.rows():
        for t in trace.tokens(r):
            known.setdefault(t.token_id, t.text)

    def lookup(i: int) -> str | None:
        i = int(i)
        if i in known:
            return known[i]
        if fallback is not None:
            try:
                return fallback(i)
            except (IndexError, KeyError, ValueError, OverflowError):
                return None
        return None
    return lookup


def shown_text(lookup: Callable[[int], str | None]) -> Callable[[int], str]:
    """A lookup for views that need a string: an unknown id reads #id."""
    def text(i: int) -> str:
        found = lookup(i)
        return f"#{int(i)}" if found is None else found
    return text


def _is_id(key) -> bool:
    return isinstance(key, str) and re.fullmatch(r"[0-9]{1,9}", key) is not None


def _int(value) -> int:
    if isinstance(value, bool):
        return 0
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return v if 0 <= v < 2**31 else 0
