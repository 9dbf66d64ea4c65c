"""IdMap: a reduced vocabulary (model id i = tokenizer id ids[i]) with a lossless byte fallback (torch-free)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..spec.errors import InputError, MissingFileError
from ..spec.json_file import read_json_file
from .tokenizer import BOS_ID, EOS_ID, NOISE_ID, PAD_ID, Tokenizer, byte_level_alphabet

# Special tokenizer ids every reduced vocabulary keeps: the model and DSpark use them even if the text never does.
KEPT_SPECIALS = (BOS_ID, EOS_ID, PAD_ID, NOISE_ID)
ID_MAP_NAME = "id_map.json"
MAX_ID_MAP_BYTES = 16 << 20   # a map of the whole 129,280-id vocabulary takes ~1 MiB


def byte_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Tokenizer id of the single-byte token for each byte 0..255 (the ByteLevel base alphabet)."""
    by_byte = {b: c for c, b in byte_level_alphabet().items()}
    ids = [tokenizer.backend.token_to_id(by_byte[b]) for b in range(256)]
    missing = [b for b, i in enumerate(ids) if i is None]
    if missing:
        raise InputError(f"tokenizer {tokenizer.path.name} lacks single-byte tokens for bytes {missing[:8]}; "
                         "the byte fallback needs all 256")
    return ids


class IdMap:
    """Tokenizer ids a model embeds, ascending, so ids 0/1/2 (bos/eos/pad) keep their numbers.

    The unknown-token fallback is the token's own bytes: a tokenizer id outside the map becomes the
    single-byte tokens that spell it (all 256 are always kept), so encode → decode is lossless for any text.
    """

    def __init__(self, ids: Sequence[int], tokenizer: Tokenizer, min_count: int | None = None):
        self.tokenizer = tokenizer
        self.min_count = min_count
        self.ids = np.asarray(ids, dtype=np.int64)
        if self.ids.ndim != 1 or self.ids.size == 0:
            raise InputError("IdMap needs a non-empty list of tokenizer ids")
        if np.any(np.diff(self.ids) <= 0):
            raise InputError("IdMap ids must be strictly increasing tokenizer ids (no repeats)")
        if self.ids[0] < 0 or self.ids[-1] >= tokenizer.full_vocab_size:
            raise InputError(f"IdMap ids must lie in 0..{tokenizer.full_vocab_size - 1}, "
                             f"found {self.ids[0]}..{self.ids[-1]}")
        self.to_model = np.full(tokenizer.full_vocab_size, -1, dtype=np.int64)
        self.to_model[self.ids] = np.arange(self.ids.size)
        byte_ids = np.asarray(byte_token_ids(tokenizer))
        lacking = [KEPT_SPECIALS[i] for i, t in enumerate(KEPT_SPECIALS) if self.to_model[t] < 0]
        if lacking or np.any(self.to_model[byte_ids] < 0):
            raise InputError(f"IdMap must keep the special ids {list(KEPT_SPECIALS)} and all 256 byte tokens "
                             f"(missing specials: {lacking})")
        self.byte_model_ids = self.to_model[byte_ids]                         # [256] model id of each byte
        self._spelled: dict[int, list[int]] = {}

    # ---- building -----------------------------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts: Counter | dict[int, int], tokenizer: Tokenizer, min_count: int) -> "IdMap":
        """Keep every tokenizer id seen at least `min_count` times, plus the specials and the byte tokens."""
        if min_count < 1:
            raise InputError(f"min_count must be at least 1, got {min_count}")
        keep = {t for t, n in counts.items() if n >= min_count}
        keep.update(KEPT_SPECIALS)
        keep.update(byte_token_ids(tokenizer))
        return cls(sorted(keep), tokenizer, min_count)

    # ---- sizes and named ids ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.ids.size)

    def model_id(self, tokenizer_id: int) -> int:
        """The model id of a kept tokenizer id; ValueError if the map dropped it."""
        if not 0 <= tokenizer_id < self.to_model.size or self.to_model[tokenizer_id] < 0:
            raise InputError(f"tokenizer id {tokenizer_id} is not in this {self.vocab_size}-id vocabulary")
        return int(self.to_model[tokenizer_id])

    # ---- text <-> model ids -------------------------------------------------------------------------
    def map_ids(self, tokenizer_ids: Iterable[int]) -> np.ndarray:
        """Tokenizer ids → model ids; each unknown id is replaced by the byte tokens that spell it."""
        full = np.asarray(list(tokenizer_ids) if not isinstance(tokenizer_ids, np.ndarray) else tokenizer_ids,
                          dtype=np.int64)
        if full.size and (full.min() < 0 or full.max() >= self.to_model.size):
            raise InputError(f"tokenizer ids must lie in 0..{self.to_model.size - 1}")
        mapped = self.to_model[full]
        unknown = np.flatnonzero(mapped < 0)
        if unknown.size == 0:
            return mapped
        pieces, begin = [], 0
        for u in unknown:
            pieces.append(mapped[begin:u])
            pieces.append(np.asarray(self.spell(int(full[u])), dtype=np.int64))
            begin = u + 1
        pieces.append(mapped[begin:])
        return np.concatenate(pieces)

    def spell(self, tokenizer_id: int) -> list[int]:
        """The byte-token model ids that spell one tokenizer id (the fallback for an unknown token)."""
        if tokenizer_id not in self._spelled:
            data = self.tokenizer.token_bytes(tokenizer_id, full=True)
            self._spelled[tokenizer_id] = [int(self.byte_model_ids[b]) for b in data]
        return self._spelled[tokenizer_id]

    def encode(self, text: str) -> list[int]:
        """Model ids of `text` (no BOS added); tokens outside the map fall back to bytes."""
        return self.map_ids(self.tokenizer.encode(text)).tolist()

    def decode(self, model_ids: Iterable[int]) -> str:
        ids = np.asarray(list(model_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise InputError(f"model ids must lie in 0..{self.vocab_size - 1}, found {ids.min()}..{ids.max()}")
        return self.tokenizer.decode(self.ids[ids].tolist())

    def model_tokenizer(self) -> Tokenizer:
        """The engine's Tokenizer over this map (strict: it refuses unknown tokens instead of spelling them)."""
        return Tokenizer(self.tokenizer.path, id_map=self.ids.tolist())

    def engram_token_map(self, full_token_map: np.ndarray) -> np.ndarray:
        """Engram compressed id per model id: the real tokenizer's compression, restricted to the kept ids."""
        full_token_map = np.asarray(full_token_map)
        if full_token_map.shape != (self.tokenizer.full_vocab_size,):
            raise InputError(f"the full token map has shape {full_token_map.shape}; expected "
                             f"({self.tokenizer.full_vocab_size},)")
        return full_token_map[self.ids]

    # ---- files --------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": "v41viz-id-map/1", "tokenizer_sha256": self.tokenizer.fingerprint,
                "vocab_size": self.vocab_size, "min_count": self.min_count, "fallback": "bytes",
                "ids": self.ids.tolist()}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path = path / ID_MAP_NAME if path.is_dir() else path
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, tokenizer: Tokenizer) -> "IdMap":
        """Read an id_map.json (at most MAX_ID_MAP_BYTES), checked: InputError naming the file and the field for
        anything but an object with format 'v41viz-id-map/1', this tokenizer's sha256, an 'ids' list of integer
        tokenizer ids and an integer (or null) 'min_count'; MissingFileError if it cannot be read."""
        path = Path(path)
        path = path / ID_MAP_NAME if path.is_dir() else path
        raw = read_json_file(path, "id map", MAX_ID_MAP_BYTES, InputError, unreadable=MissingFileError)
        if not isinstance(raw, dict):
            raise InputError(f"{path}: not a v41viz id map: it is a JSON {type(raw).__name__}, not an object with "
                             "format 'v41viz-id-map/1' and an 'ids' list")
        if raw.get("format") != "v41viz-id-map/1" or not isinstance(raw.get("ids"), list):
            raise InputError(f"{path}: not a v41viz id map (needs format 'v41viz-id-map/1' and an 'ids' list)")
        wrong = next((i for i, t in enumerate(raw["ids"]) if type(t) is not int), None)
        if wrong is not None:
            raise InputError(f"{path}: 'ids' must list integer tokenizer ids; item {wrong} is "
                             f"{str(raw['ids'][wrong])[:40]!r}")
        if raw.get("min_count") is not None and type(raw["min_count"]) is not int:
            raise InputError(f"{path}: 'min_count' must be an integer or null, got {str(raw['min_count'])[:40]!r}")
        if raw.get("tokenizer_sha256") != tokenizer.fingerprint:
            built_for = str(raw.get("tokenizer_sha256"))[:80]
            raise InputError(f"{path}: the id map was built for tokenizer sha256 {built_for}, but the loaded "
                             f"tokenizer is {tokenizer.fingerprint}")
        outside = next((t for t in raw["ids"] if not 0 <= t < tokenizer.full_vocab_size), None)
        if outside is not None:
            raise InputError(f"{path}: 'ids' holds {str(outside)[:40]}, outside the tokenizer's ids "
                             f"0..{tokenizer.full_vocab_size - 1}")
        try:
            return cls(raw["ids"], tokenizer, raw.get("min_count"))
        except InputError as e:
            raise InputError(f"{path}: {e}") from None

    def __repr__(self) -> str:
        return f"IdMap(vocab_size={self.vocab_size}, min_count={self.min_count})"
