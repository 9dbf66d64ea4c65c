"""The opt-in view of the routed experts: each expert's w1 / w2 / w3 norm (Frobenius, dequantized), computed shard by
shard with progress and cached per shard in a small JSON file beside the folder (or in the user's cache folder where
that is not writable), so that a second look, or a look after more shards were downloaded, reads only what is new.
The routed experts are most of a checkpoint's bytes: no other view reads them."""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from .collect import Collector, ViewResult, measured
from .reader import WeightReader, layer_of

EXPERT_WEIGHT = re.compile(r"^(?P<module>(layers|mtp)\.\d+\.ffn\.experts)\.(?P<expert>\d+)\.(?P<w>w[123])\.weight$")
CACHE_FORMAT = "v41viz-expert-norms/1"
CACHE_SUFFIX = ".v41viz-expert-norms.json"
MAX_CACHE_BYTES = 64 << 20   # 256 experts × 3 × 46 layers of names and numbers take ~3 MB
Progress = Callable[[int, int, str], None]   # (shards done, shards to do, the shard just done)


def cache_path(folder: Path) -> Path:
    """FOLDER.v41viz-expert-norms.json beside the folder if its parent is writable, else under the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache)/v41viz/, named by a hash of the folder's real path."""
    folder = folder.resolve()
    beside = folder.parent / (folder.name + CACHE_SUFFIX)
    if os.access(folder.parent, os.W_OK) and (not beside.exists() or os.access(beside, os.W_OK)):
        return beside
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "v41viz" / (hashlib.sha256(str(folder).encode()).hexdigest()[:16] + CACHE_SUFFIX)


def expert_norms(reader: WeightReader, progress: Progress | None = None, cache: Path | None = None) -> ViewResult:
    """Rows (module `….ffn.experts`, axis expert, stat norm_w1 / norm_w2 / norm_w3) for every routed expert whose
    shard is here; absent experts are reported per layer. Cached shards are not read again (result.cached says
    whether every shard came from the cache)."""
    cache = cache or cache_path(reader.folder)
    return measured(reader, "experts", lambda c: _collect(c, cache, progress))


def _collect(c: Collector, cache: Path, progress: Progress | None) -> None:
    reader = c.reader
    names = [n for n in reader.weight_map if EXPERT_WEIGHT.match(n)]
    by_shard: dict[str, list[str]] = {}
    for name in names:
        if reader.has(name):
            by_shard.setdefault(reader.entries[name][0], []).append(name)
        else:
            c.get(name, EXPERT_WEIGHT.match(name)["module"])   # records why it is absent
    stored, note = _load(cache)
    if note:
        c.result.notes.append(note)
    shards = stored.setdefault("shards", {})
    computed = 0
    for done, shard in enumerate(sorted(by_shard), 1):
        key = _shard_key(reader.folder / shard)
        entry = shards.get(shard)
        if not (isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("norms"), dict)
                and set(by_shard[shard]) <= set(entry["norms"])):
            norms = {}
            for name in by_shard[shard]:
                w = c.get(name, EXPERT_WEIGHT.match(name)["module"], WeightReader.weight)
                if w is not None:
                    norms[name] = float(w.norm())
            entry = shards[shard] = {"key": key, "norms": norms}
            computed += 1
            if not c.result.problems:   # a damaged tensor is looked at again next time
                _save(cache, stored, c)
        for name in by_shard[shard]:
            value = entry["norms"].get(name)
            if isinstance(value, (int, float)):
                m = EXPERT_WEIGHT.match(name)
                c.add(m["module"], name, layer_of(name, reader.args), "expert", int(m["expert"]), f"norm_{m['w']}",
                      value)
        if progress is not None:
            progress(done, len(by_shard), shard)
    c.result.cached = computed == 0 and bool(by_shard)
    c.result.notes.append(f"cache: {cache} ({len(by_shard) - computed} of {len(by_shard)} shard(s) from it)")


def _shard_key(file: Path) -> list[int]:
    """What says a shard changed: its size and modification time (ns)."""
    st = file.stat()
    return [st.st_size, st.st_mtime_ns]


def _load(cache: Path) -> tuple[dict, str]:
    """The cache's contents ({} if absent), and a note if it was there but unusable (it is then rewritten)."""
    try:
        if not cache.is_file():
            return {}, ""
        if cache.stat().st_size > MAX_CACHE_BYTES:
            return {}, f"cache {cache} is larger than {MAX_CACHE_BYTES >> 20} MiB; recomputed"
        data = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return {}, f"cache {cache} is unreadable ({e}); recomputed"
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("shards"), dict):
        return {}, f"cache {cache} is not an expert-norms cache of this version; recomputed"
    return data, ""


def _save(cache: Path, stored: dict, c: Collector) -> None:
    """Written after each shard (an interrupted run resumes), atomically; a cache that cannot be written is said."""
    stored["format"] = CACHE_FORMAT
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored), encoding="utf-8")
        tmp.replace(cache)
    except OSError as e:
        note = f"cache {cache} could not be written ({e.strerror or e})"
        if note not in c.result.notes:
            c.result.notes.append(note)
