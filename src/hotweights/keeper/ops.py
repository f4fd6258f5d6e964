"""What the daemon does with one decoded request: the ops over the registry.

``Ops.handle(msg, fds, peer_pid) -> (reply, out_fds)``. A caller error is a typed
``Error`` reply plus one (rate-limited, cut-short) warning line; every fd that came
with the request is owned by the registry or closed before ``handle`` returns. Replies
are bounded: a mismatch lists at most ``MAX_DIFFS`` differing fields.

Lifetime: published fds belong to the registry; an attach reply carries dups that the
daemon closes right after sending them.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .. import __version__, evidence
from ..key import CacheKey
from ..manifest import Manifest
from ..pools.fds import host_pools, pool_fds_problem
from ..protocol import (
    PROTOCOL_VERSION, Attach, AttachMismatch, AttachMiss, AttachOk, Describe, DescribeOk, Error, Export, ExportEnd,
    ExportOk, Hello, HelloOk, Lookup, LookupOk, Message, Park, ParkOk, Publish, PublishOk, Release, ReleaseOk, Status,
    StatusOk, Stop, StopOk,
)
from ..wire import close_fds
from .fdstore import FdStore
from .limits import Warnings
from .metrics import NO_METRICS
from .registry import DEVICE, HOST, TIERS, Registry

logger = logging.getLogger("hotweights.daemon")
MAX_DIFFS = 32
_RESULTS = {AttachOk: "ok", AttachMiss: "miss", AttachMismatch: "mismatch"}  # an attach reply -> its metric label
Reply = tuple[Message, list[int]]  # a reply and the fds it carries


class Ops:
    def __init__(self, *, max_bytes: int, warnings: Warnings, on_stop: Callable[..., None]) -> None:
        self.registry = Registry()
        self.max_bytes = max_bytes
        self.warnings = warnings
        self.on_stop = on_stop
        self.started = time.monotonic()
        self.store = FdStore()  # the service manager's fd store, when there is one
        self.metrics = NO_METRICS  # the server sets a metrics.Metrics with --metrics-port
        self.handover_until = 0.0  # monotonic time: publishes are refused until then (each Export renews it)
        self.metrics_address = ""  # host:port of /metrics, for status
        self._handlers: dict[type, Callable[[Any, list[int], int], Reply]] = {
            Hello: self._hello, Status: self._status, Attach: self._attach_op, Lookup: self._lookup,
            Publish: self._publish_op,
            Export: self._export, Release: self._release, Stop: self._stop, Park: self._park,
            Describe: self._describe}

    def handle(self, msg: Message, fds: list[int], peer_pid: int) -> tuple[Message, list[int]]:
        handler = self._handlers.get(type(msg))
        if handler is None:
            close_fds(fds)
            return Error("bad_message", f"{type(msg).__name__} is a reply, not a request"), []
        if not isinstance(msg, Publish) and fds:
            close_fds(fds)
            return Error("bad_message", f"op {type(msg).__name__} takes no fds, got {len(fds)}"), []
        return handler(msg, fds, peer_pid)

    def _hello(self, msg: Hello, _fds: list[int], _peer: int) -> Reply:
        if msg.version != PROTOCOL_VERSION:
            return Error("version", f"client speaks protocol {msg.version}, daemon {PROTOCOL_VERSION}; "
                                    f"use matching hotweights versions"), []
        return HelloOk(PROTOCOL_VERSION, __version__, os.getpid()), []

    def _status(self, _msg: Status, _fds: list[int], _peer: int) -> Reply:
        rows, per_device, parked = self.registry.describe()
        return StatusOk(os.getpid(), __version__, time.monotonic() - self.started, [r.to_wire() for r in rows],
                        per_device, "torch" in sys.modules, self.max_bytes, self.metrics_address,
                        self.store.enabled, parked), []

    def _attach_op(self, msg: Attach, _fds: list[int], peer_pid: int) -> Reply:
        if self.metrics is NO_METRICS:  # the attach path pays for metrics only when they are on
            return self._attach(msg, peer_pid)
        start = time.perf_counter()
        reply, out = self._attach(msg, peer_pid)
        self.metrics.attach(_RESULTS.get(type(reply), "error"), time.perf_counter() - start)
        return reply, out

    def _lookup(self, msg: Lookup, _fds: list[int], peer_pid: int) -> Reply:
        manifest = self.registry.find(msg.key)
        if manifest is not None:
            return LookupOk(msg.key.short, manifest.nbytes, manifest.tensor_nbytes), []
        return self._not_served(msg.key, peer_pid, "lookup"), []

    def _publish_op(self, msg: Publish, fds: list[int], peer_pid: int) -> Reply:
        if time.monotonic() < self.handover_until:
            close_fds(fds)
            return Error("busy", "the daemon is handing its entries to a new one (hotweights daemon --replace); "
                                 "publish again in a moment"), []
        if msg.tier not in TIERS:
            close_fds(fds)
            return Error("bad_message", f"tier must be one of {list(TIERS)}, got {msg.tier!r}"), []
        published = self._publish(msg.manifest, fds, peer_pid, tier=msg.tier)
        self.metrics.publish("ok" if isinstance(published, PublishOk) else "refused")
        return published, []

    def _export(self, msg: Export, _fds: list[int], peer_pid: int) -> Reply:
        if time.monotonic() >= self.handover_until:
            logger.info("hand-off: exporting every entry to peer_pid=%d; publishes refused meanwhile", peer_pid)
        # a hand-off that fails half-way (the new daemon died) lets publishes in again a minute later
        self.handover_until = time.monotonic() + 60.0
        found = self.registry.nth(msg.index)
        return (ExportOk(found[0]), found[1]) if found else (ExportEnd(), [])

    def _release(self, msg: Release, _fds: list[int], peer_pid: int) -> Reply:
        if not msg.all and not msg.key_short:
            return Error("bad_message", "release needs a key or all=true"), []
        if msg.tier not in ("", *TIERS):
            return Error("bad_message", f"tier must be one of {list(TIERS)} or '' (both), got {msg.tier!r}"), []
        released = self.registry.release(None if msg.all else msg.key_short, msg.tier)
        self.store.forget([m for tier, m in released if tier == DEVICE])
        shorts = list(dict.fromkeys(m.key.short for _, m in released))
        models = dict.fromkeys(f"{m.key.model}[{m.key.short}]" for _, m in released)
        logger.info("released: keys=%s tiers=%s peer_pid=%d models=%s", ",".join(shorts) or "-", msg.tier or "all",
                    peer_pid, ",".join(models) or "-")
        return ReleaseOk(shorts), []

    def _describe(self, msg: Describe, _fds: list[int], _peer: int) -> Reply:
        manifest = self.registry.describe_one(msg.key_short)
        if manifest is None:
            return Error("not_found", f"no entry with key {msg.key_short} (hotweights status lists them)"), []
        return DescribeOk(manifest), []

    def _park(self, msg: Park, _fds: list[int], peer_pid: int) -> Reply:
        if msg.level not in (0, 1, 2) or msg.held_bytes < 0:
            return Error("bad_message", f"park level must be 0, 1 or 2 and held_bytes >= 0, got {msg.level}, "
                                        f"{msg.held_bytes}"), []
        self.registry.park(msg.key, peer_pid, msg.level, msg.held_bytes)
        logger.info("%s: key=%s peer_pid=%d level=%d held=%d model=%s", "parked" if msg.level else "woke",
                    msg.key.short, peer_pid, msg.level, msg.held_bytes, msg.key.model)
        return ParkOk(), []

    def _stop(self, msg: Stop, _fds: list[int], peer_pid: int) -> Reply:
        if msg.restart and not self.store.enabled:
            return Error("bad_message", "a restart keeps the entries only under a service manager (its fd "
                                        "store); without one, use hotweights daemon --replace"), []
        logger.info("%s requested: peer_pid=%d", "restart (entries left in the fd store)" if msg.restart else "stop",
                    peer_pid)
        self.on_stop(restart=msg.restart)
        return StopOk(), []

    def _attach(self, msg: Attach, peer_pid: int) -> tuple[Message, list[int]]:
        if msg.tier not in TIERS:
            return Error("bad_message", f"tier must be one of {list(TIERS)}, got {msg.tier!r}"), []
        found = self.registry.lookup(msg.key, msg.tier)
        if found is not None:
            manifest, dups = found
            logger.info("attach served: key=%s peer_pid=%d tensors=%d pools=%d%s model=%s", msg.key.short, peer_pid,
                        len(manifest.tensors), len(manifest.pools), " tier=host" if msg.tier == HOST else "",
                        msg.key.model)
            return AttachOk(manifest), dups
        if msg.tier == HOST:
            return AttachMiss(f"the daemon holds no host copy of {msg.key.short}"), []
        return self._not_served(msg.key, peer_pid, "attach"), []

    def _not_served(self, key: CacheKey, peer_pid: int, op: str) -> Message:
        """The miss, or the mismatch with the closest entry, for ``key``."""
        closest = self.registry.closest(key)
        if closest is None:
            logger.info("%s miss: key=%s peer_pid=%d reason=empty model=%s", op, key.short, peer_pid, key.model)
            return AttachMiss(f"the daemon holds no entries (requested {key.short})")
        manifest, diffs = closest
        logger.info("%s mismatch: key=%s peer_pid=%d closest=%s diffs=%d model=%s closest_model=%s", op, key.short,
                    peer_pid, manifest.key.short, len(diffs), key.model, manifest.key.model)
        lines = [str(d) for d in diffs[:MAX_DIFFS]]
        if len(diffs) > MAX_DIFFS:
            lines.append(f"... and {len(diffs) - MAX_DIFFS} more differences")
        return AttachMismatch(manifest.key.model, manifest.key.short, lines)

    def restore(self, manifest: Manifest, fds: list[int]) -> str | None:
        """An entry the service manager kept (``fdstore.restore``): published through the same checks, not
        stored again (the store still holds it); None, or why it was refused (then the store forgets it)."""
        reply = self._publish(manifest, fds, os.getpid(), store=False)
        if isinstance(reply, Error):
            self.store.forget([manifest])
            return reply.message
        return None

    def _publish(self, manifest: Manifest, fds: list[int], peer_pid: int, *, store: bool = True,
                 tier: str = DEVICE) -> Message:
        taken = False
        try:
            problem = pool_fds_problem(manifest.pools if tier == DEVICE else host_pools(manifest.pools), fds)
            if problem:
                self.warnings.warn("publish", "publish rejected: peer_pid=%d key=%s reason=%s", peer_pid,
                                   manifest.key.short, problem)
                return Error("bad_manifest", problem)
            taken = True
            refusal = self.registry.add(manifest, fds, max_bytes=self.max_bytes, tier=tier)
            if refusal is not None:
                self.warnings.warn("publish", "publish rejected: peer_pid=%d key=%s reason=%s", peer_pid,
                                   manifest.key.short, refusal[0])
                return Error(*refusal)
            key = manifest.key
            if tier == HOST:  # the service manager's store keeps device entries only (a restart drops host copies)
                logger.info("host copy published: key=%s peer_pid=%d bytes=%d model=%s", key.short, peer_pid,
                            manifest.nbytes, key.model)
                return PublishOk(key.short)
            if store:
                self.store.keep(manifest, fds)
            logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short,
                                           key.device, manifest.load_s))
            return PublishOk(key.short)
        finally:
            if not taken:
                close_fds(fds)
