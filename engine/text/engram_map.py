"""Engram compressed-token map (spec §4.4.1): tokenizer id -> compressed id, cached on disk and in memory."""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Regex, normalizers

from ..spec.errors import InputError
from .tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from ..spec.config import ModelArgs
    from .vocab import IdMap

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"
REPLACEMENT_CHAR = "\ufffd"
_SENTINEL = "\ue000"  # private-use char that carries a whitespace-only token through Strip


def compression_normalizer():
    """The HF `tokenizers` normalizer N of §4.4.1.

    Whitespace runs collapse to one space; a key that is exactly one space is protected from Strip by the
    sentinel so that whitespace-only tokens keep the key " " rather than becoming empty.
    """
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), _SENTINEL),
        normalizers.Strip(),
        normalizers.Replace(_SENTINEL, " "),
    ])


def decoded_vocabulary(tokenizer: Tokenizer) -> list[str]:
    """What each id decodes to alone (raw Rust decoder, special tokens kept), in id order."""
    ids = [[i] for i in range(tokenizer.full_vocab_size)]
    return tokenizer.backend.decode_batch(ids, skip_special_tokens=False)


def token_keys(tokenizer: Tokenizer, normalize: Callable[[str], str] | None = None,
               raw_for_partial_bytes: bool = True, texts: list[str] | None = None) -> list[str]:
    """The compression key of every tokenizer id, in id order (full vocabulary, not an id_map subset).

    `normalize` and `raw_for_partial_bytes` exist so tests can show that each rule of §4.4.1 matters;
    `texts` reuses a decoded_vocabulary() already at hand.
    """
    normalize = normalize or compression_normalizer().normalize_str
    backend = tokenizer.backend
    texts = decoded_vocabulary(tokenizer) if texts is None else texts
    if len(texts) != tokenizer.full_vocab_size:
        raise InputError(f"texts has {len(texts)} entries for {tokenizer.full_vocab_size} token ids")
    keys = []
    for token_id, text in enumerate(texts):
        if raw_for_partial_bytes and REPLACEMENT_CHAR in text:
            keys.append(backend.id_to_token(token_id))  # a piece of a UTF-8 character: its raw vocab string
        else:
            keys.append(normalize(text) or text)
    return keys


def number_by_first_appearance(keys: list[str]) -> np.ndarray:
    """Compressed id = index of the key's first appearance among distinct keys (0, 1, 2, ...)."""
    seen: dict[str, int] = {}
    return np.fromiter((seen.setdefault(k, len(seen)) for k in keys), dtype=np.int64, count=len(keys))


def build_token_map(tokenizer: Tokenizer | None = None) -> np.ndarray:
    """Cold build (about 1.5 s): int64 array [full_vocab_size] of compressed ids."""
    return number_by_first_appearance(token_keys(tokenizer or load_tokenizer()))


@dataclass(frozen=True)
class TokenMapLoad:
    """A token map and where it came from: 'memory', 'disk' or 'built' (with the seconds it took)."""
    token_map: np.ndarray
    source: str
    seconds: float
    cache_path: Path | None

    @property
    def compressed_vocab_size(self) -> int:
        return int(self.token_map.max()) + 1


def cache_path_for(tokenizer: Tokenizer, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or CACHE_DIR) / f"engram_map-{tokenizer.fingerprint[:16]}.npy"


def load_token_map_report(tokenizer: Tokenizer | None = None, cache_dir: str | Path | None = None,
                          rebuild: bool = False) -> TokenMapLoad:
    """The token map via memory cache, then the disk cache, then a cold build that refills both.

    `rebuild=True` skips both caches (to time the build) and rewrites them.
    """
    tokenizer = tokenizer or load_tokenizer()
    path = cache_path_for(tokenizer, Path(cache_dir) if cache_dir else None)
    t0 = time.perf_counter()
    if not rebuild and path in _MEMORY:
        return TokenMapLoad(_MEMORY[path], "memory", time.perf_counter() - t0, path)
    token_map = None if rebuild else _read_cache(path, tokenizer.full_vocab_size)
    source = "disk"
    if token_map is None:
        token_map, source = build_token_map(tokenizer), "built"
        _write_cache(path, token_map)
    token_map.setflags(write=False)  # shared by every caller: nobody may edit it in place
    _MEMORY[path] = token_map
    return TokenMapLoad(token_map, source, time.perf_counter() - t0, path)


def load_token_map(tokenizer: Tokenizer | None = None, cache_dir: str | Path | None = None) -> np.ndarray:
    """Read-only int64 array [129280]: tokenizer id -> Engram compressed id (99,092 distinct values)."""
    return load_token_map_report(tokenizer, cache_dir).token_map


def lookup(args: "ModelArgs", tokenizer: Tokenizer | None = None, cache_dir: str | Path | None = None) -> np.ndarray:
    """The token map for a model, checked against its config (`engram_compressed_vocab_size`, `vocab_size`)."""
    token_map = load_token_map(tokenizer, cache_dir)
    distinct = int(token_map.max()) + 1
    if distinct != args.engram_compressed_vocab_size:
        raise InputError(f"the tokenizer compresses to {distinct} Engram ids but the config's "
                         f"engram_compressed_vocab_size is {args.engram_compressed_vocab_size}; "
                         f"the checkpoint was built for a different tokenizer or compression rule")
    if len(token_map) != args.vocab_size:
        raise InputError(f"the token map covers {len(token_map)} tokenizer ids but the config's vocab_size is "
                         f"{args.vocab_size}")
    return token_map


def model_token_map(args: "ModelArgs", tokenizer: Tokenizer, id_map: "IdMap | None" = None) -> np.ndarray | None:
    """The token map in the model's ids: None for a model without Engram; with a reduced vocabulary (id_map),
    the full tokenizer's compression, checked on the full map, restricted to the model's ids."""
    if not args.has_engram:
        return None
    if id_map is None:
        return lookup(args, tokenizer)
    full = lookup(args.replace(vocab_size=id_map.tokenizer.full_vocab_size), id_map.tokenizer)
    return id_map.engram_token_map(full)


_MEMORY: dict[Path, np.ndarray] = {}


def _read_cache(path: Path, vocab_size: int) -> np.ndarray | None:
    """The cached array, or None if absent or not a valid map (then it is rebuilt and overwritten)."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if arr.dtype != np.int64 or arr.shape != (vocab_size,) or arr.min() < 0 or not _first_appearance_order(arr):
        return None
    return arr


def _first_appearance_order(arr: np.ndarray) -> bool:
    """True if new values appear as 0, 1, 2, ... in order (what first-appearance numbering produces)."""
    _, first = np.unique(arr, return_index=True)
    return bool(np.all(np.diff(first) > 0)) and int(arr.max()) + 1 == len(first)


def _write_cache(path: Path, token_map: np.ndarray) -> None:
    """Atomic write (temp file + rename) so concurrent readers never see half a file; best effort."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, token_map, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        # a read-only checkout still works; it just rebuilds once per process
