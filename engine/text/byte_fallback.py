"""The tokenizer of a reduced-vocabulary checkpoint: model ids, with byte tokens for what the model lacks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..spec.errors import InputError
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .vocab import IdMap


class ByteFallbackTokenizer(Tokenizer):
    """Ids are model ids (IdMap order), and encode spells tokens the model lacks with byte tokens instead of
    refusing them, so any text can be prompted."""

    def __init__(self, id_map: IdMap):
        super().__init__(id_map.tokenizer.path, id_map=id_map.ids.tolist())
        self.reduced_vocab = id_map

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"encode() takes a str, got {type(text).__name__}")
        return self.reduced_vocab.encode(text)
