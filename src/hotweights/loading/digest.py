"""Content digests of checkpoint files, cached by file identity.

A file's digest is xxh3-128 over the concatenated xxh3-128 digests of its consecutive
``BLOCK_BYTES`` blocks (a two-level tree), so blocks can be hashed by parallel readers.
The loader hashes each file while it reads it anyway, and records the
digest under the file's identity ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``.
An engine's warm path looks the digest up by ``stat`` alone and never reads weight
bytes. A file rewritten or replaced in place changes its identity (ctime cannot be set
by a user), so the lookup misses and the engine hashes the file: the changed bytes
can never match the cached entry.

The cache is an optimisation: one that cannot be read or written (a read-only or full file system, a
``readOnlyRootFilesystem`` pod) costs hashing, never a start. The first failure is said once per path,
with the path and the reason, and leaves no temporary file behind.

Not covered: a change made below the file system (raw block writes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

import xxhash

from ..paths import digest_cache_path

logger = logging.getLogger(__name__)
BLOCK_BYTES = 64 << 20
_lock = threading.Lock()
_unwritable: set[Path] = set()  # paths already said to be unwritable (said once per process)


def file_identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def block_digest(data) -> bytes:
    """Digest of one block (xxhash releases the GIL: blocks hash in parallel threads)."""
    return xxhash.xxh3_128_digest(data)


def combine(block_digests: list[bytes]) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(block_digests))


def hash_file(path: Path) -> str:
    """Read and hash a whole file (the slow path: only when the cache has no entry)."""
    digests = []
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(BLOCK_BYTES)
        view = memoryview(buf)
        while True:
            n = 0
            while n < BLOCK_BYTES and (got := f.readinto(view[n:])):
                n += got
            if not n:
                break
            digests.append(block_digest(view[:n]))
    return combine(digests)


class DigestCache:
    """A JSON map identity -> digest in the user's cache directory."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or digest_cache_path()
        self._data: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._data is None:
            try:
                data = json.loads(self.path.read_text())
                self._data = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
            except (FileNotFoundError, ValueError, AttributeError):
                self._data = {}
            except OSError as exc:  # unreadable: start empty, hash as needed
                _say_unusable(self.path, "read", exc)
                self._data = {}
        return self._data

    def get(self, st: os.stat_result) -> str | None:
        return self._load().get(file_identity(st))

    def put(self, st: os.stat_result, digest: str) -> None:
        """Remember ``digest``; when the cache cannot be written, say so once and go on without it."""
        with _lock:
            data = self._load()
            data[file_identity(st)] = digest
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(data))
                os.replace(tmp, self.path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                _say_unusable(self.path, "written", exc)

    def digest(self, path: Path, st: os.stat_result, *, rehash: bool = False) -> str:
        """Cached digest, else hash the file now (logged: it reads every byte).

        ``rehash`` hashes the file even when the cache has it: the only way to notice bytes
        changed through a shared mapping, which changes neither mtime nor ctime.
        """
        cached = None if rehash else self.get(st)
        if cached is not None:
            return cached
        logger.info("digest %s: file=%s bytes=%d; hashing it", "re-hash" if rehash else "cache miss", path,
                    st.st_size)
        digest = hash_file(path)
        if os.stat(path).st_mtime_ns == st.st_mtime_ns:
            self.put(st, digest)
        return digest


def _say_unusable(path: Path, what: str, exc: OSError) -> None:
    if path in _unwritable:
        return
    _unwritable.add(path)
    logger.warning("digest cache %s cannot be %s (%s); going on without it: checkpoints are hashed on every "
                   "start (set HOTWEIGHTS_CACHE_DIR to a writable directory)", path, what,
                   exc.strerror or exc)
