"""Small tables as markdown, drawn with the page's text: no data grid or Arrow decoding to load in the browser (the
first view stays light), text selectable, every cell shown literally."""
from __future__ import annotations

import math
import numbers

import pandas as pd
import streamlit as st

from .plain_text import literal


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned (integers with thousands separators), missing
    values empty."""
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in df.columns]
    head = "| " + " | ".join(literal(str(c)) for c in df.columns) + " |"
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, numbers.Real) and math.isnan(value)):
        return ""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return f"{int(value):,}"
    return literal(str(value), limit=1000)


def show_table(df: pd.DataFrame, container=st, scroll_height: int | None = None) -> None:
    """Draw df in container; taller than scroll_height px, it scrolls inside a box of that height."""
    if scroll_height is not None and len(df) > scroll_height // 36:
        container = container.container(height=scroll_height)
    container.markdown(markdown_table(df))
