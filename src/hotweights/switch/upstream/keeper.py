"""What the switch asks the keeper about one model: its entries (typed rows), whether the engine layout of every
rank is cached already, and moving the weights of a parked engine to the keeper's host copy (``hotweights
demote``: a process with a CUDA context makes it; the keeper has none) and back (``hotweights promote``). Torch-free.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from ...client import connect
from ...evidence import size_text
from ...paths import daemon_paths
from ...rows import EntryRow
from ..config import ModelConfig
from ..kinds import EngineKind
from .process import EngineError


@dataclass(frozen=True)
class _On:
    """The device of a keeper row, as a key needs it (``pools.devices.Device`` imports torch)."""

    kind: str
    uuid: str


class KeeperView:
    """The keeper's entries of one model (OSError or HotweightsError from the calls when no keeper answers)."""

    def __init__(self, model: ModelConfig, kind: EngineKind, socket_dir: str, env: dict[str, str]) -> None:
        self.model, self.kind, self.socket_dir, self.env = model, kind, socket_dir, env

    def rows(self) -> list[EntryRow]:
        with connect(daemon_paths(self.socket_dir or None)) as client:
            return client.status().rows()

    def own(self) -> list[EntryRow]:
        """The entries of this model, as its engine maps them."""
        return [r for r in self.rows() if self.kind.owns(r, self.model)]

    def cached(self) -> bool:
        """Whether what this model's preload would publish is in the keeper already (a front started again then
        runs no preload process): for an engine layout an entry of every rank; else the checkpoint's key. An entry
        of which only the host copy is left (a host-tier model parked by the front before) counts: ``promote``
        makes its device copy again before the start."""
        if self.kind.engine_layout:
            return self.layout_cached()
        return self.checkpoint_cached(self.kind.preload_dtype(self.model))

    def layout_cached(self) -> bool:
        """Whether an entry of every rank is on its device already: a front started again skips the preload (for
        vLLM a whole start per model; the engine's attach checks the key)."""
        size = self.kind.ranks(self.model)
        have = {r.rank for r in self.own() if r.nbytes or r.host_nbytes}
        return all((rank, size) in have for rank in range(size))

    def checkpoint_cached(self, dtype: str) -> bool:
        """Whether the keeper holds this checkpoint, as its files are now, under the key its preload would publish:
        a front started again then runs no preload process (2-4 s each for the embedded engine). The shards' digests
        come from the digest cache by file identity (a file that changed is read again, as the preload would)."""
        from ...loading.checkpoint import checkpoint_key, open_checkpoint

        rows = [r for r in self.own() if r.nbytes or r.host_nbytes]
        if not rows:
            return False
        ckpt = open_checkpoint(self.model.checkpoint, validate=False)
        for row in rows:
            kind, _, uuid = row.device.partition(":")
            key = checkpoint_key(ckpt, dtype=dtype, device=_On(kind, uuid) if kind == "cuda" else None)
            if key.short == row.key:
                return True
        return False

    def host_copy_ahead(self) -> int:
        """A host copy of each of this (awake) model's entries, their GPU copies kept: its first park with
        ``parked_weights = "host"`` then only lets the GPU copy go. The entries copied."""
        todo = [r for r in self.own() if r.nbytes and not r.host_nbytes]
        for row in todo:
            self._demote(row.key, keep=True)
        return len(todo)

    def promote(self) -> int:
        """The device copy of each of this model's entries of which only the host copy is left, made again from it
        (``hotweights promote``: an upload, not a preload): its engine's start maps it. The entries promoted."""
        todo = [r for r in self.own() if r.host_nbytes and not r.nbytes]
        for row in todo:
            self._run("promote", row.key)
        return len(todo)

    def device_copy_off(self) -> int:
        """The GPU copy of each of this model's entries that has a host copy too, and no engine parked on it, let go
        (its start makes it again: ``promote``). The bytes let go."""
        rows = [r for r in self.own() if r.nbytes and r.host_nbytes and not r.parked_on]
        with connect(daemon_paths(self.socket_dir or None)) as client:
            for row in rows:
                client.release(row.key, tier="device")
        return sum(r.nbytes for r in rows)

    def weights_to_host(self, pids: set[int]) -> str:
        """Let the GPU copies of the entries the engine ``pids`` are parked on go, keeping a host copy of each (made
        here if there is none yet): its next wake uploads them. What happened, in a few words."""
        rows = [r for r in self.rows() if r.nbytes and any(pid in pids for pid, _ in r.parked_on)]
        copied = [r for r in rows if not r.host_nbytes]
        for row in copied:
            self._demote(row.key)
        with connect(daemon_paths(self.socket_dir or None)) as client:
            for row in rows:
                if row.host_nbytes:
                    client.release(row.key, tier="device")
        made = "" if not copied else " (its host copy made)" if len(copied) == 1 else f" ({len(copied)} host copies " \
            "made)"
        return f"{size_text(sum(r.nbytes for r in rows))} to host memory{made}"

    def _demote(self, key: str, keep: bool = False) -> None:
        self._run("demote", key, *(["--keep"] if keep else []))

    def _run(self, verb: str, key: str, *extra: str) -> None:
        """``hotweights demote|promote KEY``: a process with a CUDA context moves the bytes (the keeper has none)."""
        cmd = [sys.executable, "-m", "hotweights", verb, key, "--json", *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=600)
        if done.returncode != 0:
            what = "no host copy" if verb == "demote" else "no device copy"
            raise EngineError(f"{self.model.name}: {what} of {key}: "
                              f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
