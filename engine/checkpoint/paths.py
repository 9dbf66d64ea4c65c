"""Checkpoint paths: what a path names (a symlink loop or an unreadable path said as such), and shard files
kept inside their checkpoint folder."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from ..spec.errors import MissingFileError
from .errors import CheckpointError


def existing(path: str | Path, what: str = "checkpoint") -> Path:
    """`path` if it exists. MissingFileError if nothing is there; CheckpointError for a symlink loop, a path that
    cannot be looked at (permissions, a name too long, a NUL byte), or something that is neither file nor folder."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except ValueError as e:  # an embedded NUL byte
        raise CheckpointError(f"{path!r}: not a usable {what} path ({e})") from None
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise MissingFileError(f"{path}: no such {what}") from None
        if e.errno == errno.ELOOP:
            raise CheckpointError(f"{path}: symbolic link loop (a link that leads back to itself); point at the real "
                                  f"{what} folder or file") from None
        raise CheckpointError(f"{path}: cannot open the {what} ({e.strerror or e})") from None
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise CheckpointError(f"{path}: not a file or folder (a device, pipe or socket cannot be a {what})")
    return path


def shard_inside(folder: Path, name: object, index: Path) -> Path:
    """The shard file an index entry names, refused unless it lies inside `folder`: a relative file name without
    '..', whose real path (symlinks followed) is in the folder, or in the blob store of a Hugging Face cache
    snapshot (snapshots/<rev>/x → ../../blobs/<hash>). The file need not exist (callers report missing shards)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"{index}: a weight_map entry names shard {name!r}; shard names are file names")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name:
        raise CheckpointError(f"{index}: weight_map entry {name!r} points outside the checkpoint folder {folder}; "
                              "shards must be files inside it")
    shard = folder / name
    try:
        real, home = shard.resolve(), folder.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
        raise CheckpointError(f"{index}: shard {name} is a symbolic link loop") from None
    hf_blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if not (real.is_relative_to(home) or (hf_blobs is not None and real.parent == hf_blobs)):
        raise CheckpointError(f"{index}: shard {name} is a symbolic link to {real}, outside the checkpoint folder "
                              f"{folder}; shards must be files inside it")
    return shard
