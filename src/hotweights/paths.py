"""Where the daemon's socket, lock and log live, and the trust checks on that directory.

Lookup order (the only place it is done): ``--socket-dir`` / ``socket_dir``, else
``$HOTWEIGHTS_SOCKET_DIR``, else ``$XDG_RUNTIME_DIR/hotweights``, else
``/tmp/hotweights-<uid>``. The directory must be a real directory (no symlink),
owned by the user, and not group/world accessible: anyone who can reach the socket
can read every cached weight. The daemon checks it before it binds; every client
checks it (and the daemon's uid) before it sends a byte (``client.connect``).

Not covered: the digest cache location (``digest_cache_path``), which is a plain
per-user cache file and holds no secrets.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import TrustError

SOCKET_NAME = "daemon.sock"
LOCK_NAME = "daemon.lock"
LOG_NAME = "daemon.log"
LOG_KEEP_BYTES = 16 << 20  # a daemon starting beside a larger log moves it to daemon.log.1 (one old log kept)


@dataclass(frozen=True, slots=True)
class DaemonPaths:
    directory: Path

    @property
    def socket(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def lock(self) -> Path:
        return self.directory / LOCK_NAME

    @property
    def log(self) -> Path:
        return self.directory / LOG_NAME


def rotate_log(log: Path, keep_bytes: int = LOG_KEEP_BYTES) -> None:
    """Move ``log`` to ``<log>.1`` (replacing an older one) when it has grown beyond ``keep_bytes``."""
    try:
        if log.stat().st_size > keep_bytes:
            os.replace(log, log.with_name(log.name + ".1"))
    except FileNotFoundError:
        pass


def resolve_socket_dir(socket_dir: str | os.PathLike[str] | None = None) -> Path:
    """The socket directory for this user, by the documented lookup order."""
    if socket_dir:
        return Path(socket_dir)
    if env := os.environ.get("HOTWEIGHTS_SOCKET_DIR"):
        return Path(env)
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "hotweights"
    return Path(f"/tmp/hotweights-{os.getuid()}")


def daemon_paths(socket_dir: str | os.PathLike[str] | None = None) -> DaemonPaths:
    return DaemonPaths(resolve_socket_dir(socket_dir))


def check_socket_dir(directory: Path) -> None:
    """Raise TrustError unless ``directory`` is a private directory of this user."""
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise TrustError(f"socket dir {directory} is a symlink; pass a real directory with --socket-dir")
    if not stat.S_ISDIR(st.st_mode):
        raise TrustError(f"socket dir {directory} is not a directory; remove it or pass --socket-dir")
    if st.st_uid != os.getuid():
        raise TrustError(
            f"socket dir {directory} is owned by uid {st.st_uid}, not {os.getuid()}: another user made it, so no "
            f"daemon there is trusted; remove it, or pass a directory you own with --socket-dir (or set "
            f"HOTWEIGHTS_SOCKET_DIR)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise TrustError(
            f"socket dir {directory} is group/world accessible (mode {mode:04o}); "
            f"chmod 700 it or pass --socket-dir"
        )


def ensure_socket_dir(directory: Path) -> None:
    """Create ``directory`` 0700 if missing, then run the trust checks."""
    try:
        directory.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    check_socket_dir(directory)


def cache_dir() -> Path:
    """Per-user directory of hotweights' caches: ``$HOTWEIGHTS_CACHE_DIR``, else ``$XDG_CACHE_HOME/hotweights``, else
    ``~/.cache/hotweights``."""
    if env := os.environ.get("HOTWEIGHTS_CACHE_DIR"):
        return Path(env)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "hotweights"
    return Path.home() / ".cache" / "hotweights"


def digest_cache_path() -> Path:
    """Per-user file that caches checkpoint digests by file identity."""
    return cache_dir() / "digests.json"
