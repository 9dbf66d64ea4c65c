"""Tokens of a traced row: labels for plot axes, the token table, and text coloured by a per-token value."""
from __future__ import annotations

import html
import math
import unicodedata
from typing import Callable

import numpy as np
import pandas as pd

from engine.trace import Trace

WHITESPACE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"}
AXIS_CHARS = 6     # token text kept in an axis label (the hover and the table show all of it)


def visible(text: str) -> str:
    """A token's text with whitespace and control characters made visible (a space is ·, a line break ⏎,
    other invisible characters their \\u escape); ∅ for an empty text."""
    out = []
    for ch in text:
        if ch in WHITESPACE:
            out.append(WHITESPACE[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") or (ch.isspace() and ch != " "):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) or "∅"


def token_label(text: str, pos: int, chars: int = 12) -> str:
    """A short, unambiguous label: position, then the token text with whitespace made visible (cut with …)."""
    shown = visible(text)
    return f"{pos}:{shown if len(shown) <= chars else shown[:chars - 1] + '…'}"


def labels(trace: Trace, row: int, positions, chars: int = 12) -> list[str]:
    texts = {t.pos: t.text for t in trace.tokens(row)}
    return [token_label(texts.get(p, "?"), p, chars) for p in positions]


def axis_labels(trace: Trace, row: int, positions) -> list[str]:
    """Labels for a token axis: short, so that thinned and turned upright they never overlap."""
    return labels(trace, row, positions, AXIS_CHARS)


def token_probability(t) -> float:
    """The probability the model gave this token at its position: teacher-forced for a prompt token, from the
    distribution it was drawn from (before sampling filters) for a generated one; NaN when not recorded."""
    if t.logprob == t.logprob:
        return math.exp(t.logprob)
    chosen = t.top_probs[t.top_ids == t.token_id]
    return float(chosen[0]) if chosen.size else math.nan


def probability_text(p: float) -> str:
    """0.4213, or 3.21e-05 for a probability too small for four decimals."""
    return f"{p:.4f}" if p >= 1e-3 else f"{p:.2e}"


def alternatives(t, token_text: Callable[[int], str | None]) -> str:
    """The top-k ids the model weighed at this position, each as 'text' p (#id); the token itself is marked ✓."""
    parts = []
    for i, p in zip(t.top_ids.tolist(), t.top_probs.tolist()):
        text = token_text(i)
        shown = f"'{visible(text)}'" if text is not None else "(text unknown)"
        parts.append(f"{'✓ ' if i == t.token_id else ''}{shown} {p:.3f} (#{i})")
    return " · ".join(parts)


def token_table(trace: Trace, row: int = 0, token_text: Callable[[int], str | None] = lambda i: None) -> pd.DataFrame:
    """One line per token: position, visible text, id, prompt or generated, its probability under the model,
    the top-k alternatives with their text, and the step time."""
    rows = []
    for t in trace.tokens(row):
        p = token_probability(t)
        if p == p:
            prob = probability_text(p)
        else:
            prob = "– (first token: nothing before it)" if t.pos == 0 else "– (not recorded)"
        rows.append({"pos": t.pos, "text": visible(t.text), "id": t.token_id,
                     "kind": "generated" if t.generated else "prompt", "p under the model": prob,
                     "top-k alternatives: 'text' p (#id)": alternatives(t, token_text),
                     "step ms": round(t.step_time_s * 1e3, 1) if t.generated else None})
    return pd.DataFrame(rows, columns=["pos", "text", "id", "kind", "p under the model",
                                       "top-k alternatives: 'text' p (#id)", "step ms"])


def token_detail_html(trace: Trace, row: int, pos: int, token_text: Callable[[int], str | None]) -> str:
    """One line about the token at `pos`: its text, kind, probability under the model and the alternatives the
    model weighed there (escaped, whitespace visible)."""
    t = next((t for t in trace.tokens(row) if t.pos == pos), None)
    if t is None:
        return f"<div>position {pos}: no token recorded</div>"
    p = token_probability(t)
    how = "drawn from the model's distribution" if t.generated else "teacher-forced: given the prompt before it"
    prob = f"p under the model <b>{probability_text(p)}</b> ({how})" if p == p else (
        "no probability: nothing comes before the first token" if t.pos == 0 else "probability not recorded")
    alts = alternatives(t, token_text)
    return (f'<div style="font-size:0.9rem"><code>{html.escape(token_label(t.text, t.pos, 40))}</code> '
            f'({"generated" if t.generated else "prompt"}, id {t.token_id}) · {prob}'
            + (f" · alternatives: <code>{html.escape(alts)}</code>" if alts else "") + "</div>")


def coloured_text_html(texts: list[str], values: list[float], title: str, lo: float = 0.0, hi: float = 1.0) -> str:
    """Spans whose background deepens with value in [lo, hi] (NaN = not recorded: no colour); hover gives it."""
    spans = []
    for text, v in zip(texts, values):
        shown = html.escape(text).replace("\n", "⏎<br>") or "∅"
        if v is None or np.isnan(v):
            spans.append(f'<span title="{html.escape(title)}: not recorded" style="color:#6b7280">{shown}</span>')
            continue
        a = float(np.clip((v - lo) / (hi - lo), 0, 1)) if hi > lo else 0.5
        spans.append(f'<span title="{html.escape(title)}: {v:.3f}" style="background:rgba(200,116,28,{0.1 + 0.8 * a:.2f});'
                     f'border-radius:3px;padding:1px 1px">{shown}</span>')
    return '<div style="line-height:1.9;font-family:monospace;white-space:pre-wrap">' + "".join(spans) + "</div>"


def literal_text_html(prompt: str, generated: str) -> str:
    """The prompt (bold) and the generated text exactly as they are: escaped, spaces and line breaks kept."""
    return ('<div style="white-space:pre-wrap;overflow-wrap:anywhere;font-family:monospace;line-height:1.6">'
            f"<b>{html.escape(prompt)}</b>{html.escape(generated)}</div>")


def whitespace_note(generated: str) -> str:
    """How much of the generated text is whitespace, so a mostly-blank output explains itself."""
    spaces, breaks = generated.count(" "), generated.count("\n")
    other = sum(ch.isspace() for ch in generated) - spaces - breaks
    parts = [_count(spaces, "space"), _count(breaks, "line break")] + ([f"{other} other whitespace"] if other else [])
    return f"{len(generated)} characters generated, of which {', '.join(parts)}."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
