"""The daemon's registry: cache key -> entry (manifest + the daemon's own pool fds), in tiers.

Tiers: an entry lives on its key's device (``device``: what attaches and lookups serve) and, for a
deep park, may also have a **host copy** (``host``): the same manifest (same key, tensors, pool sizes)
whose pools' bytes are in sealed memfds. A host copy is served only to an attach that asks for it by
tier (a deep-parked engine that maps its weights again at the same addresses), never for another key;
both tiers of one key must agree on the tensors. Parked engines say so (``park``), and ``describe``
shows them per entry (pids gone are dropped).

Lifetime: the registry owns exactly one fd per pool of each ready entry. An attach
gets ``os.dup`` copies that the client owns; the registry's fds are closed only on
release or shutdown. Physical memory lives while any process holds an fd or a
mapping, so engines that attached keep their weights after a release or a daemon
death. An entry is present or it is not: publishing happens in one message.

Thread-safety: every public method takes the registry lock.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from ..evidence import size_text
from ..key import CacheKey, FieldDiff
from ..manifest import Manifest
from ..rows import EntryRow
from ..unix import pid_alive
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


DEVICE, HOST = "device", "host"
TIERS = (DEVICE, HOST)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, Entry] = {}
        self._host: dict[CacheKey, Entry] = {}  # host copies (a tier of their own)
        self._parked: dict[CacheKey, dict[int, tuple[int, int]]] = {}  # key -> pid -> (level, bytes held)

    def _tier(self, tier: str) -> dict[CacheKey, Entry]:
        return self._host if tier == HOST else self._entries

    def add(self, manifest: Manifest, fds: list[int], *, max_bytes: int = 0, tier: str = DEVICE
            ) -> tuple[str, str] | None:
        """Take ownership of ``fds`` and keep the entry; or refuse with ``(code, message)``, fds closed.

        The budget is checked under the same lock as the insert, so concurrent publishes
        cannot overshoot it together.
        """
        with self._lock:
            refusal = None
            in_use = sum(e.manifest.nbytes for t in (self._entries, self._host) for e in t.values())
            other = (self._entries if tier == HOST else self._host).get(manifest.key)
            if manifest.key in self._tier(tier):
                what = "a host copy of " if tier == HOST else ""
                refusal = ("exists", f"{what}entry {manifest.key.short} is already published; release it first")
            elif other is not None and (other.manifest.tensors, other.manifest.pools) != (manifest.tensors,
                                                                                          manifest.pools):
                refusal = ("bad_manifest", f"the {tier} tier of {manifest.key.short} must have the tensors and pools "
                                           f"of its other tier, and does not")
            elif max_bytes and in_use + manifest.nbytes > max_bytes:
                refusal = ("budget", f"entry of {size_text(manifest.nbytes)} would exceed the daemon budget of "
                                     f"{size_text(max_bytes)} ({size_text(in_use)} in use); release an entry or raise "
                                     f"--max-bytes")
            if refusal:
                close_fds(fds)
                return refusal
            self._tier(tier)[manifest.key] = Entry(manifest, list(fds))
            return None

    def lookup(self, key: CacheKey, tier: str = DEVICE) -> tuple[Manifest, list[int]] | None:
        """The manifest and fresh dups of the pool fds, which the caller must close."""
        with self._lock:
            entry = self._tier(tier).get(key)
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

    def describe_one(self, key_short: str) -> Manifest | None:
        """The manifest of the entry (either tier) whose short key is ``key_short``."""
        with self._lock:
            entry = next((e for t in (self._entries, self._host) for k, e in t.items() if k.short == key_short), None)
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

    def release(self, key_short: str | None, tier: str = "") -> list[tuple[str, Manifest]]:
        """Release one entry by short key (or all with None), in ``tier`` ('': both); ``(tier, manifest)``
        of each copy released."""
        released: dict[str, list[Entry]] = {}
        with self._lock:
            for name in (TIERS if not tier else (tier,)):
                table = self._tier(name)
                keys = [k for k in table if key_short is None or k.short == key_short]
                released[name] = [table.pop(k) for k in keys]
            for key in [k for k in self._parked if k not in self._entries and k not in self._host]:
                del self._parked[key]
        for entries in released.values():
            for entry in entries:
                close_fds(entry.fds)
        return [(name, e.manifest) for name, entries in released.items() for e in entries]

    def park(self, key: CacheKey, pid: int, level: int, held: int) -> None:
        """Process ``pid`` is parked on ``key`` at ``level`` (0: awake again), holding ``held`` bytes of its own."""
        with self._lock:
            notes = self._parked.setdefault(key, {})
            if level:
                notes[pid] = (level, held)
            else:
                notes.pop(pid, None)

    def describe(self) -> tuple[list[EntryRow], dict[str, int], dict[str, int]]:
        """Rows, bytes per device (host copies count as ``cpu``), bytes held by parked engines per device."""
        with self._lock:
            for notes in self._parked.values():
                for pid in [p for p in notes if not pid_alive(p)]:
                    del notes[pid]
            rows = []
            for key in dict.fromkeys([*self._entries, *self._host]):
                device, host = self._entries.get(key), self._host.get(key)
                row = (device or host).row()  # type: ignore[union-attr]  # one of them is there
                held_by = sorted(self._parked.get(key, {}).items())
                parked = EntryRow.parked_text((pid, level) for pid, (level, _) in held_by)
                rows.append(dataclasses.replace(row, nbytes=device.manifest.nbytes if device else 0,
                                                host_nbytes=host.manifest.nbytes if host else 0, parked=parked,
                                                parked_bytes=sum(held for _, (_, held) in held_by)))
            parked_by: dict[str, int] = {}
            for key, notes in self._parked.items():
                parked_by[key.device] = parked_by.get(key.device, 0) + sum(held for _, held in notes.values())
        per_device: dict[str, int] = {}
        for r in rows:
            per_device[r.device] = per_device.get(r.device, 0) + r.nbytes
            if r.host_nbytes:
                per_device["cpu"] = per_device.get("cpu", 0) + r.host_nbytes
        return rows, per_device, parked_by


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
