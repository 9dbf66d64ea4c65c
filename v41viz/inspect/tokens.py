"""Tokens of a traced row: labels for plot axes, the token table, and text coloured by a per-token value."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from engine.trace import Trace


def token_label(text: str, pos: int) -> str:
    """A short, unambiguous axis label: position, then the token text with whitespace made visible."""
    shown = text.replace("\n", "⏎").replace(" ", "·") or "∅"
    return f"{pos}:{shown[:12]}"


def labels(trace: Trace, row: int, positions) -> list[str]:
    texts = {t.pos: t.text for t in trace.tokens(row)}
    return [token_label(texts.get(p, "?"), p) for p in positions]


def token_table(trace: Trace, row: int = 0) -> pd.DataFrame:
    """One line per token: position, text, id, prompt or generated, probability, top alternatives, step time."""
    rows = []
    for t in trace.tokens(row):
        alts = ", ".join(f"{i}:{p:.2f}" for i, p in zip(t.top_ids.tolist(), t.top_probs.tolist()))
        chosen = t.top_probs[t.top_ids == t.token_id]
        rows.append({"pos": t.pos, "text": t.text, "id": t.token_id, "kind": "generated" if t.generated else "prompt",
                     "p (top-k)": float(chosen[0]) if chosen.size else np.nan, "top-k id:p": alts,
                     "step ms": t.step_time_s * 1e3 if t.generated else np.nan})
    return pd.DataFrame(rows, columns=["pos", "text", "id", "kind", "p (top-k)", "top-k id:p", "step ms"])


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
