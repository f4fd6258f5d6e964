"""The daemon's registry: cache key -> entry (manifest + the daemon's own pool fds).

Lifetime: the registry owns exactly one fd per pool of each ready entry. An attach
gets ``os.dup`` copies that the client owns; the registry's fds are closed only on
release or shutdown. Physical memory lives while any process holds an fd or a
mapping, so engines that attached keep their weights after a release or a daemon
death. An entry is present or it is not: publishing happens in one message.

Thread-safety: every public method takes the registry lock.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from ..key import CacheKey, FieldDiff
from ..manifest import Manifest
from ..protocol import EntryRow
from ..wire import close_fds


@dataclass
class Entry:
    manifest: Manifest
    fds: list[int]
    published_at: float = field(default_factory=time.time)
    num_attaches: int = 0

    def row(self) -> EntryRow:
        key, m = self.manifest.key, self.manifest
        return EntryRow(key.short, key.model, key.dtype, key.arch, key.layout, key.device,
                        f"{key.tp_rank}/{key.tp_size}", m.nbytes, m.tensor_nbytes, len(m.tensors), len(m.pools),
                        self.num_attaches, self.published_at)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, Entry] = {}

    def add(self, manifest: Manifest, fds: list[int], *, max_bytes: int = 0) -> tuple[str, str] | None:
        """Take ownership of ``fds`` and keep the entry; or refuse with ``(code, message)``, fds closed.

        The budget is checked under the same lock as the insert, so concurrent publishes
        cannot overshoot it together.
        """
        with self._lock:
            refusal = None
            in_use = sum(e.manifest.nbytes for e in self._entries.values())
            if manifest.key in self._entries:
                refusal = ("exists", f"entry {manifest.key.short} is already published; release it first")
            elif max_bytes and in_use + manifest.nbytes > max_bytes:
                refusal = ("budget", f"entry of {_size(manifest.nbytes)} would exceed the daemon budget of "
                                     f"{_size(max_bytes)} ({_size(in_use)} in use); release an entry or raise "
                                     f"--max-bytes")
            if refusal:
                close_fds(fds)
                return refusal
            self._entries[manifest.key] = Entry(manifest, list(fds))
            return None

    def lookup(self, key: CacheKey) -> tuple[Manifest, list[int]] | None:
        """The manifest and fresh dups of the pool fds, which the caller must close."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            dups = _dup_all(entry.fds)
            entry.num_attaches += 1
            return entry.manifest, dups

    def find(self, key: CacheKey) -> Manifest | None:
        """The manifest of ``key``'s entry, without fds and without counting an attach (a lookup)."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.manifest

    def nth(self, index: int) -> tuple[Manifest, list[int]] | None:
        """The ``index``-th entry in publish order and fresh dups of its fds (a hand-off: not an attach)."""
        with self._lock:
            entries = list(self._entries.values())
            if not 0 <= index < len(entries):
                return None
            return entries[index].manifest, _dup_all(entries[index].fds)

    def closest(self, key: CacheKey) -> tuple[Manifest, list[FieldDiff]] | None:
        """The entry with the fewest differing fields, and those fields; None if empty."""
        with self._lock:
            best: tuple[Manifest, list[FieldDiff]] | None = None
            for entry in self._entries.values():
                diffs = entry.manifest.key.diff(key)
                if best is None or len(diffs) < len(best[1]):
                    best = (entry.manifest, diffs)
            return best

    def release(self, key_short: str | None) -> list[Manifest]:
        """Release one entry by short key (or all with None); returns what it released."""
        with self._lock:
            keys = [k for k in self._entries if key_short is None or k.short == key_short]
            released = [self._entries.pop(k) for k in keys]
        for entry in released:
            close_fds(entry.fds)
        return [entry.manifest for entry in released]

    def describe(self) -> tuple[list[EntryRow], dict[str, int]]:
        with self._lock:
            entries = [e.row() for e in self._entries.values()]
        per_device: dict[str, int] = {}
        for e in entries:
            per_device[e.device] = per_device.get(e.device, 0) + e.nbytes
        return entries, per_device


def _dup_all(fds: list[int]) -> list[int]:
    """Fresh dups of ``fds`` for one reply (the caller closes them); none left open on failure."""
    dups: list[int] = []
    try:
        for fd in fds:
            dups.append(os.dup(fd))
    except OSError:
        close_fds(dups)
        raise
    return dups


def _size(nbytes: int) -> str:
    """Bytes as a person reads them: GiB, MiB, or bytes (the unit ``--max-bytes 8G`` takes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.2f} {unit}"
    return f"{nbytes} bytes"
