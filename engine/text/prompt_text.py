"""The one rule for prompt text on every path (CLI, engine API, app): valid Unicode, not blank, a bounded length."""
from __future__ import annotations

import re

from ..spec.errors import InputError

# The longest token of the DeepSeek vocabulary spells 128 characters (tests/commands/test_bad_arguments.py checks
# it), so a text of more than 128 × max_seq_len characters cannot fit the context: it is refused without tokenizing
# it.
MAX_TOKEN_CHARS = 128

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text, label: str) -> str:
    """`text` if it is a str of valid Unicode; else an InputError naming `label`, the problem and its position.

    Python carries bytes that are not UTF-8 in a command-line argument as the surrogates U+DC80..U+DCFF
    (surrogateescape); any other lone surrogate (U+D800..U+DFFF) is no character either. Neither can be tokenized.
    """
    if not isinstance(text, str):
        raise InputError(f"{label} must be text (a str), got {type(text).__name__}")
    found = _SURROGATE.search(text)
    if found is None:
        return text
    code, pos = ord(found.group()), found.start()
    if 0xDC80 <= code <= 0xDCFF:
        offset = len(text[:pos].encode("utf-8"))  # no surrogate before pos, so this encodes
        raise InputError(f"{label} is not valid UTF-8: its byte {offset + 1} (0x{code - 0xDC00:02x}, in character "
                         f"{pos + 1}) does not decode; pass the text in UTF-8")
    raise InputError(f"{label} is not valid text: character {pos + 1} is a lone UTF-16 surrogate (U+{code:04X}), half "
                     "of a character that lost its other half; delete it")


def check_prompt_text(text, label: str, max_seq_len: int | None = None) -> str:
    """`text` if it can be a prompt: check_text, not empty or whitespace only, and (given the model's max_seq_len)
    not so long that it cannot fit whatever it tokenizes to. The token count itself is checked after encoding."""
    check_text(text, label)
    if not text:
        raise InputError(f"{label} is empty: give some text to continue")
    if not text.strip():
        raise InputError(f"{label} is empty apart from whitespace: give some text to continue")
    if max_seq_len is not None and len(text) > max_seq_len * MAX_TOKEN_CHARS:
        raise InputError(f"{label} has {len(text):,} characters, more than the model's max_seq_len of {max_seq_len:,} "
                         f"tokens can hold (no token spells more than {MAX_TOKEN_CHARS} characters)")
    return text
