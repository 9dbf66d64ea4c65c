"""Untrusted text (upload names, messages that quote a file) made safe to show literally in Streamlit markdown."""
from __future__ import annotations

import re
import unicodedata
from html import escape

# Every ASCII punctuation character may be backslash-escaped in CommonMark, which then shows it as itself; this
# also defuses Streamlit's own markup (:red[...], :material/icon:, $math$) and any HTML.
PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
INVISIBLE = ("Cc", "Cf", "Cs", "Zl", "Zp")   # control, format, surrogate, line and paragraph separators


def short_name(text: str, limit: int = 80) -> str:
    """Text for a label or a title: invisible characters shown as their \\u escape, at most `limit` characters."""
    shown = "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in INVISIBLE else ch for ch in str(text))
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def literal(text: str, limit: int = 400) -> str:
    """`text` as markdown that renders as exactly these characters (see short_name), punctuation escaped."""
    return PUNCTUATION.sub(r"\\\1", short_name(text, limit))


def preformatted(text: str) -> str:
    """HTML for st.html: text in a monospace block, every character kept (a formula; no code highlighter to load)."""
    return ('<pre style="margin:0 0 1rem 0;padding:0.8rem 1rem;border-radius:0.5rem;background:rgba(151,166,195,0.15);'
            'font-family:\'Source Code Pro\',monospace;font-size:0.82rem;line-height:1.5;white-space:pre;'
            f'overflow-x:auto">{escape(text)}</pre>')


def load_failure(name: str, error: Exception) -> str:
    """'Could not load NAME: problem', the name said once: the engine's trace messages start with the file's name
    ('bad.json: not a readable trace'), which the sentence already gives."""
    problem = str(error)
    for prefix in (f"{name}: ", f"{name.rsplit('/', 1)[-1]}: "):
        problem = problem.removeprefix(prefix)
    return f"Could not load {name}: {problem}"
