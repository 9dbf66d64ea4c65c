"""Incremental detokenization: decoded text per token, held back while it ends inside a UTF-8 character."""
from __future__ import annotations

from ..text.tokenizer import Tokenizer


class TextStream:
    """Emits new text once it no longer ends in a partial UTF-8 character (decode shows that as U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token: int) -> str:
        """The text this token completes ('' while a character is still partial)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.emitted = text[self.emitted:], len(text)
        return piece
