"""``hotweights daemon --replace``: a new daemon takes every entry of the running one, then its place.

1. Connect to the running daemon as any client does (trusted directory, peer uid, hello with this
   protocol version: a daemon of another protocol version is refused in one line and keeps serving).
2. ``Export`` every entry (manifest + pool fds, in publish order) and publish each into this daemon's
   registry through the same checks as any publish. While it exports, the old daemon refuses
   publishes (``busy``; for a minute after the last export, should the new daemon fail half-way),
   so none lands in it unseen.
3. Bind a socket beside the old one and rename it over ``daemon.sock``: every new connection reaches
   this daemon, which holds every entry. The old one finishes what it is serving.
4. Export again (nothing new can have come: publishes were refused), stop the old daemon, wait for
   its lock (it exits: its socket path is ours now, which it checks by inode before unlinking), take it.

Attaches never miss during the hand-off: before the rename the old daemon serves them, after it the
new one; a connection left in the old listener's backlog when it closes is reset, and the client
asks again (``client.is_transient``). The pool memory is the same throughout: fds are passed, not
bytes copied.

Settings: the new daemon keeps the running one's ``--max-bytes`` and metrics address unless its own
command line gives them (``inherit``; the log says which it kept and which changed). Under a service
manager (the running daemon keeps its entries in systemd's fd store) the new daemon must be the unit's:
``--replace`` then asks the running daemon to exit for a restart and waits for the manager to start
the installed hotweights with the stored entries (``restart_managed``), rather than start one outside
the unit.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from typing import TYPE_CHECKING, Any

from ..client import connect, is_daemon_starting
from ..errors import DaemonUnavailable, HotweightsError, ProtocolError
from ..paths import DaemonPaths, ensure_socket_dir
from ..protocol import AttachMiss, AttachOk, Export, ExportEnd, ExportOk, Publish, PublishOk, StatusOk, Stop
from ..wire import close_fds

if TYPE_CHECKING:
    from ..client import Client
    from .server import Daemon, DaemonConfig

LOCK_WAIT_S = 30.0  # the old daemon's exit, after Stop


def take_over(daemon: Daemon) -> str:
    """Run steps 1-4 for ``daemon`` (a ``server.Daemon`` not yet opened); a line saying what happened."""
    paths = daemon.config.paths
    ensure_socket_dir(paths.directory)
    start = time.monotonic()
    try:
        old = connect(paths, timeout_s=5.0)
    except DaemonUnavailable as exc:
        if is_daemon_starting(paths):  # a daemon holds the lock but did not answer as one of ours
            raise HotweightsError(f"cannot take over from the running daemon: {exc}") from None
        daemon.open()
        return "no daemon was running; started afresh"
    with old:
        hello = old.hello()
        taken: set[str] = set()
        try:
            _take_entries(daemon, old, taken)
        except ProtocolError as exc:
            if exc.code == "unknown_op":
                raise HotweightsError(f"the running daemon (hotweights {hello.daemon_version}, pid {hello.pid}) "
                                      f"predates hand-off and keeps serving: stop it with `hotweights stop` (its "
                                      f"entries are lost) and start this one") from None
            raise
        staging = paths.directory / f"daemon.sock.{os.getpid()}"
        daemon.listen(staging, publish_as=paths.socket)  # from here new connections are ours
        _take_entries(daemon, old, taken)
        old.request(Stop())
    daemon.take_lock(wait_s=LOCK_WAIT_S)
    return (f"took {len(taken)} entries from pid {hello.pid} (hotweights {hello.daemon_version}) in "
            f"{time.monotonic() - start:.2f} s")


def _take_entries(daemon: Daemon, old: Client, taken: set[str]) -> None:
    for index in itertools.count():
        reply, fds = old.request(Export(index))
        if isinstance(reply, (ExportEnd, AttachMiss)):  # AttachMiss/AttachOk: a daemon from before ExportOk
            close_fds(fds)
            return
        if not isinstance(reply, (ExportOk, AttachOk)):
            close_fds(fds)
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to an export", code="bad_reply")
        if reply.manifest.key.short in taken:
            close_fds(fds)
            continue
        answer, _ = daemon.ops.handle(Publish(reply.manifest), fds, os.getpid())  # the fds are its now
        if not isinstance(answer, PublishOk):
            raise HotweightsError(f"entry {reply.manifest.key.short} of the running daemon was refused here: "
                                  f"{getattr(answer, 'message', answer)}")
        taken.add(reply.manifest.key.short)


def running_status(paths: DaemonPaths) -> StatusOk | None:
    """What the running daemon says of itself (its settings), or None when none answers."""
    try:
        with connect(paths, timeout_s=5.0) as old:
            return old.status()
    except DaemonUnavailable:
        return None


def inherit(config: DaemonConfig, old: StatusOk, given: frozenset[str]) -> tuple[DaemonConfig, str]:
    """``config`` with the running daemon's budget and metrics address where the user gave none (a
    ``--replace`` keeps them), and a line naming what was kept and what changed."""
    host, _, port = old.metrics.rpartition(":")
    theirs: dict[str, Any] = {"max_bytes": old.max_bytes, "metrics_port": int(port or 0),
                              "metrics_host": host or "127.0.0.1"}
    flags = {"max_bytes": "--max-bytes", "metrics_port": "--metrics-port", "metrics_host": "--metrics-host"}
    kept = {name: value for name, value in theirs.items() if name not in given}
    changed = [f"{flags[n]} {theirs[n]} -> {getattr(config, n)}" for n in theirs
               if n in given and getattr(config, n) != theirs[n]]
    shown = [f"{flags[n]} {v}" for n, v in kept.items() if v or n == "max_bytes"]
    return (dataclasses.replace(config, **kept),
            f"kept the running daemon's settings ({', '.join(shown)}); changed: {', '.join(changed) or 'none'}")


def restart_managed(paths: DaemonPaths, old: StatusOk, *, timeout_s: float = 60.0) -> str:
    """The running daemon is a service manager's (its entries in the manager's fd store): ask it to exit for
    a restart (``Stop(restart=True)``) and wait for the manager to start its successor (the installed
    hotweights) with the entries. A daemon started from here would run outside the unit and its fd store."""
    with connect(paths, timeout_s=5.0) as client:
        client.stop(restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = running_status(paths)
        if status is not None and status.pid != old.pid:
            return (f"the service manager restarted the daemon (pid {old.pid} -> {status.pid}, hotweights "
                    f"{old.daemon_version} -> {status.daemon_version}) with {len(status.entries)} of "
                    f"{len(old.entries)} entries from its fd store")
        time.sleep(0.1)
    raise HotweightsError(f"the daemon (pid {old.pid}) exited to be restarted by its service manager, but none "
                          f"answered within {timeout_s:.0f} s: see `systemctl --user status hotweights` (or the "
                          f"system unit's); its entries stay in the fd store until the unit stops")
