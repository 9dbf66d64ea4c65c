"""The service key: a fresh random secret per service start, in a file only its user can read, which clients read.

A fixed, documented key would let any process on the host drive the service; so the service makes one with the
secrets module (or takes ENGINE_SERVICE_KEY, refused when short or the old public default), writes it to
key_file(port) with mode 0600 in a folder of mode 0700, and removes it when it stops."""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ..spec.errors import InputError

KEY_ENV = "ENGINE_SERVICE_KEY"   # a key chosen by the user, for service and clients alike (else the key file)
PUBLIC_KEYS = frozenset({"v41viz-local"})   # keys once documented: anyone could know them
MIN_KEY_CHARS = 16
MAX_KEY_BYTES = 1024


def key_dir() -> Path:
    """$XDG_RUNTIME_DIR/v41viz (a per-user tmpfs, mode 0700) where there is one, else ~/.cache/v41viz."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path.home() / ".cache"
    return base / "v41viz"


def key_file(port: int) -> Path:
    return key_dir() / f"engine-service-{port}.key"


def chosen_key() -> str | None:
    """ENGINE_SERVICE_KEY when set; InputError for a key anyone could guess."""
    key = os.environ.get(KEY_ENV)
    if key is None:
        return None
    if key in PUBLIC_KEYS or len(key) < MIN_KEY_CHARS:
        raise InputError(f"{KEY_ENV} must be a secret of at least {MIN_KEY_CHARS} characters, not a published "
                         f"default; unset it and the service makes a random key per start")
    return key


def service_key(port: int) -> tuple[bytes, Path]:
    """The key this service start uses (ENGINE_SERVICE_KEY, else a new random one) and the file it is now in."""
    key = chosen_key() or secrets.token_urlsafe(32)
    path = key_file(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)   # a file left by an earlier start keeps no wider mode
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    return key.encode(), path


def client_key(port: int) -> bytes:
    """The key a client presents: ENGINE_SERVICE_KEY, else the key file of the service on this port."""
    if (key := chosen_key()) is not None:
        return key.encode()
    path = key_file(port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise InputError(f"no key for an engine service on port {port}: {path} cannot be read ({e.strerror}); "
                         f"start the service as this user, or set {KEY_ENV} for both") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InputError(f"{path} must belong to this user and be readable by no one else (mode 0600)")
        return os.read(fd, MAX_KEY_BYTES).strip()
    finally:
        os.close(fd)


def remove_key(path: Path, key: bytes) -> None:
    """Remove the key file at the service's end, unless another start has written its own key there since."""
    try:
        if path.read_bytes() == key:
            path.unlink()
    except OSError:
        pass
