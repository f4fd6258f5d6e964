"""Start-up's read-ahead: the disk kept busy with the checkpoints the preloads read next.

A preload reads its checkpoint only once its process is up and the GPU has room for it: a vLLM preload imports
vLLM first (15-25 s on an H200's host, the default model's included), and the preloads after it wait for memory
or for starts. The disk meanwhile idles, though an 8B's 16.4 GB take 10.5 s to read there (1.8 s from the page
cache). Here one thread reads the shards of the models whose preloads have not ended, in start-up order, into the
page cache, where their preloads' readers find them (vLLM's loader maps the files; ``hotweights preload`` reads
them through the cache and leaves it warm). It stays at most ``AHEAD`` models ahead of the preloads that ended,
and reads a model only where the host's available memory holds it beside a ``RESERVE`` and what it read ahead
before (``MemAvailable`` counts that as free, though it would be evicted before use). A model the keeper holds
already is done before this begins, and read by nobody. Torch-free.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import CheckpointError
from ..evidence import size_text
from ..loading.checkpoint import open_checkpoint

logger = logging.getLogger("hotweights.switch")
AHEAD = 2  # models read ahead whose preloads have not ended, at most
RESERVE = 8 << 30  # of the host's available memory, never read into
CHUNK = 16 << 20


def shard_paths(checkpoint: os.PathLike[str] | str) -> list[Path]:
    """The checkpoint's shard files, [] where it cannot be read (its preload says why)."""
    try:
        return [s.path for s in open_checkpoint(checkpoint, validate=False).shards]
    except (OSError, CheckpointError):
        return []


def available_bytes() -> int:
    """The host's available memory (``MemAvailable``), 0 where it cannot be read (then nothing is read ahead)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def read_into_cache(paths: Sequence[Path], stop: threading.Event | None = None) -> int:
    """Read ``paths`` through the page cache, front to back; the bytes read (fewer where ``stop`` was set or a file
    went away)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger read-ahead window
            while not (stop is not None and stop.is_set()):
                n = os.readv(fd, [view])
                if n <= 0:
                    break
                done += n
        except OSError:
            pass
        finally:
            os.close(fd)
    return done


class ReadAhead:
    """The read-ahead of ``models``' checkpoints (``paths(name)``: a model's files) while ``ended(name)`` says
    whether its preload has ended; ``read`` and ``available`` are the reads and ``MemAvailable`` (tests give
    their own)."""

    def __init__(self, models: Sequence[str], paths: Callable[[str], list[Path]],
                 ended: Callable[[str], bool], read: Callable[..., int] | None = None,
                 available: Callable[[], int] | None = None, look_s: float = 0.5) -> None:
        self.models, self.paths, self.ended = list(models), paths, ended
        self._read, self.available = read or read_into_cache, available or available_bytes
        self.look_s = look_s
        self.read: dict[str, int] = {}  # the models read ahead, with their bytes
        self.stop = threading.Event()

    def pending(self) -> int:
        """Bytes read ahead for models whose preloads have not ended (in the page cache, not yet used)."""
        return sum(n for name, n in self.read.items() if not self.ended(name))

    def run(self) -> None:
        """Read each model in turn, as the bounds allow (a thread: it blocks on the disk)."""
        for name in self.models:
            files = self.paths(name)
            size = sum(_size(p) for p in files)
            while not self.stop.is_set() and not self.ended(name) and (
                    sum(not self.ended(n) for n in self.read) >= AHEAD):
                time.sleep(self.look_s)  # wait for a preload to end
            if self.stop.is_set():
                return
            if self.ended(name) or not files:
                continue
            room = self.available() - self.pending() - RESERVE
            if size > room:
                logger.info("switch: %s: not read ahead (%s; %s of the host's memory available beside what was "
                            "read ahead)", name, size_text(size), size_text(max(0, room)))
                continue
            began = time.monotonic()
            self.read[name] = self._read(files, self.stop)
            took = time.monotonic() - began
            logger.info("switch: %s: read ahead into the page cache, %s in %.1f s (%.2f GB/s)", name,
                        size_text(self.read[name]), took, self.read[name] / max(took, 1e-6) / 1e9)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
