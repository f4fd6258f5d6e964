"""The service manager's file-descriptor store: entries that survive a crash of the daemon.

Under systemd (``Type=notify``, ``FileDescriptorStoreMax=``; ``deploy/systemd/``), the daemon hands
every published entry to the service manager as it publishes it: its pool fds and one small sealed
memfd holding the entry's manifest (``FDSTORE=1``, ``FDNAME=hw.<key>.m`` and ``hw.<key>.<pool>``),
and takes them back out when the entry is released (``FDSTOREREMOVE=1``). When the daemon dies
(``kill -9``, an OOM kill, a bug) the service manager keeps those fds, restarts the daemon and
passes them back (``LISTEN_FDS``, ``LISTEN_FDNAMES``): the new daemon reads each manifest, checks it
and its pool fds exactly as a publish is checked, and serves the entry again; what fails a check is
dropped and named in the log. A clean stop ends the unit and, with it, the store.

Without a service manager (no ``NOTIFY_SOCKET``) nothing of this happens: a daemon that dies loses
its entries, as before (``hotweights daemon --replace`` is the way to restart one without loss).

Stdlib only (the protocol is a datagram with ``SCM_RIGHTS``; no libsystemd).
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import socket
from collections.abc import Callable

import msgpack

from ..manifest import Manifest
from ..wire import close_fds

logger = logging.getLogger("hotweights.daemon")
PREFIX = "hw."
MANIFEST = "m"
FIRST_PASSED_FD = 3  # sd_listen_fds: passed fds start here


class FdStore:
    """The daemon's side of the store; every method a no-op without ``NOTIFY_SOCKET``."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET", "")
        if self.address.startswith("@"):
            self.address = "\0" + self.address[1:]  # an abstract socket

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, text: str, fds: list[int] | tuple[int, ...] = ()) -> None:
        if not self.enabled:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
            sock.sendmsg([text.encode()], ancillary, 0, self.address)

    def keep(self, manifest: Manifest, pool_fds: list[int]) -> None:
        """Hand ``manifest``'s entry to the store (the store gets its own copies of the fds)."""
        if not self.enabled:
            return
        short = manifest.key.short
        memfd = os.memfd_create(f"hotweights-manifest-{short}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(memfd, msgpack.packb(manifest.to_wire(), use_bin_type=True))
            fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_SEAL)
            self.notify(f"FDSTORE=1\nFDNAME={PREFIX}{short}.{MANIFEST}", [memfd])
            for i, fd in enumerate(pool_fds):
                self.notify(f"FDSTORE=1\nFDNAME={PREFIX}{short}.{i}", [fd])
        finally:
            os.close(memfd)

    def forget(self, manifests: list[Manifest]) -> None:
        """Take the entries of ``manifests`` out of the store (released, or refused on restore)."""
        if not self.enabled:
            return
        for manifest in manifests:
            for part in [MANIFEST, *map(str, range(len(manifest.pools)))]:
                self.notify(f"FDSTOREREMOVE=1\nFDNAME={PREFIX}{manifest.key.short}.{part}")


def passed_fds(environ: dict[str, str] | None = None) -> dict[str, int]:
    """The fds the service manager passed to this process, by name (``sd_listen_fds_with_names``); the
    variables are removed so that no child reads them."""
    env = os.environ if environ is None else environ
    try:
        pid, count = int(env.get("LISTEN_PID", "0")), int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(var, None)
    if pid != os.getpid() or count <= 0:
        return {}
    out = {}
    for i in range(count):
        fd = FIRST_PASSED_FD + i
        os.set_inheritable(fd, False)
        out[names[i] if i < len(names) and names[i] else f"unknown{i}"] = fd
    return out


def restore(passed: dict[str, int], publish: Callable[[Manifest, list[int]], str | None]) -> list[str]:
    """Rebuild each stored entry from ``passed`` and ``publish`` it (the daemon's own checks; it returns
    None or why it refused). Every fd is owned by the registry or closed. Lines for the log."""
    lines, used = [], set()
    for name, fd in sorted(passed.items()):
        if not (name.startswith(PREFIX) and name.endswith(f".{MANIFEST}")):
            continue
        short = name[len(PREFIX):-len(MANIFEST) - 1]
        used.add(name)
        try:
            size = os.fstat(fd).st_size
            manifest = Manifest.from_wire(msgpack.unpackb(os.pread(fd, size, 0), raw=False))
        except Exception as exc:  # a manifest that does not read back is dropped, named
            lines.append(f"entry {short}: its manifest does not read back ({exc}); dropped")
            continue
        finally:
            os.close(fd)
        pool_names = [f"{PREFIX}{short}.{i}" for i in range(len(manifest.pools))]
        used.update(pool_names)
        if manifest.key.short != short or any(n not in passed for n in pool_names):
            close_fds([passed[n] for n in pool_names if n in passed])
            lines.append(f"entry {short}: its stored fds are incomplete; dropped")
            continue
        refusal = publish(manifest, [passed[n] for n in pool_names])
        lines.append(f"entry {short} ({manifest.key.model}): " + (f"refused ({refusal}); dropped" if refusal else
                                                                   "restored from the service manager's store"))
    close_fds([fd for name, fd in passed.items() if name not in used])
    return lines
