"""Client side of the protocol: connect, hello, status, attach, publish, release, stop.

Stdlib + msgpack only (no torch): the CLI's ``status``/``release``/``stop`` stay fast.
Fds returned by ``attach`` belong to the caller, who must close them (the pool
importers do). An ``error`` reply is raised as ``ProtocolError`` carrying its code.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .errors import DaemonUnavailable, ProtocolError
from .key import CacheKey
from .manifest import Manifest, PoolSpec
from .paths import DaemonPaths
from .protocol import (
    PROTOCOL_VERSION, Attach, AttachMismatch, AttachMiss, AttachOk, Error, Hello, HelloOk, Message,
    Publish, PublishOk, Release, ReleaseOk, Status, StatusOk, Stop, StopOk, close_fds, decode_body, peek_pools,
    recv_frame, recv_message, send_message, unpack,
)


T = TypeVar("T")


class Client:
    """One connection to the daemon. Use as a context manager."""

    def __init__(self, sock: socket.socket, socket_path: Path) -> None:
        self.sock = sock
        self.socket_path = socket_path

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def request(self, msg: Message, fds: list[int] | tuple[int, ...] = ()) -> tuple[Message, list[int]]:
        send_message(self.sock, msg, fds)
        try:
            reply, reply_fds = recv_message(self.sock)
        except EOFError:
            raise ProtocolError("the daemon closed the connection without a reply", code="closed") from None
        if isinstance(reply, Error):
            close_fds(reply_fds)
            raise ProtocolError(f"daemon refused {type(msg).__name__.lower()}: {reply.message}", code=reply.code)
        return reply, reply_fds

    def _expect(self, msg: Message, cls: type) -> Message:
        reply, fds = self.request(msg)
        if fds or not isinstance(reply, cls):
            close_fds(fds)
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to {type(msg).__name__}", code="bad_reply")
        return reply

    def hello(self) -> HelloOk:
        return self._expect(Hello(PROTOCOL_VERSION), HelloOk)

    def status(self) -> StatusOk:
        return self._expect(Status(), StatusOk)

    def attach(self, key: CacheKey) -> tuple[AttachOk | AttachMiss | AttachMismatch, list[int]]:
        reply, fds = self.request(Attach(key, os.getpid()))
        return _checked_attach(reply, fds, len(fds)), fds

    def attach_pipelined(self, key: CacheKey, on_pools: Callable[[list[PoolSpec], list[int]], T]
                         ) -> tuple[AttachOk | AttachMiss | AttachMismatch, T | None]:
        """Like ``attach``, but an ``attach_ok`` frame's pools go to ``on_pools(pools, fds)``
        (which owns the fds from then on) before the rest of the reply is validated.

        The caller must check ``reply.manifest.pools`` against the pools it was given.
        """
        send_message(self.sock, Attach(key, os.getpid()))
        try:
            payload, fds = recv_frame(self.sock)
        except EOFError:
            raise ProtocolError("the daemon closed the connection without a reply", code="closed") from None
        early, nfds = None, len(fds)
        try:
            body = unpack(payload)  # once: the pools are peeked from it, then it is validated
        except BaseException:
            close_fds(fds)
            raise
        pools = peek_pools(body)
        if pools is not None and len(pools) == len(fds):
            fds, given = [], fds
            early = on_pools(pools, given)
        try:
            reply = decode_body(body)
        except BaseException:
            close_fds(fds)
            raise
        if isinstance(reply, Error):
            close_fds(fds)
            raise ProtocolError(f"daemon refused attach: {reply.message}", code=reply.code)
        _checked_attach(reply, fds, nfds)
        if isinstance(reply, AttachOk) and early is None:
            close_fds(fds)
            raise ProtocolError("attach reply's pools were not usable", code="bad_reply")
        return reply, early

    def publish(self, manifest: Manifest, fds: list[int]) -> PublishOk:
        reply, extra = self.request(Publish(manifest), fds)
        close_fds(extra)
        if not isinstance(reply, PublishOk):
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to publish", code="bad_reply")
        return reply

    def release(self, key_short: str | None) -> ReleaseOk:
        return self._expect(Release(key_short or "", key_short is None), ReleaseOk)

    def stop(self) -> None:
        self._expect(Stop(), StopOk)


def _checked_attach(reply: Message, fds: list[int], nfds: int) -> AttachOk | AttachMiss | AttachMismatch:
    if isinstance(reply, AttachOk) and nfds == len(reply.manifest.pools):
        return reply
    if isinstance(reply, (AttachMiss, AttachMismatch)) and not nfds:
        return reply
    close_fds(fds)
    raise ProtocolError(f"bad attach reply {type(reply).__name__} with {nfds} fds", code="bad_reply")


def connect(paths: DaemonPaths, *, socket_path: str | os.PathLike[str] | None = None,
            timeout_s: float = 2.0) -> Client:
    """Connect and say hello; DaemonUnavailable says why not (absent, stale, refused)."""
    path = Path(socket_path) if socket_path else paths.socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
        client = Client(sock, path)
        client.hello()
        return client
    except FileNotFoundError:
        sock.close()
        raise DaemonUnavailable(f"no daemon socket at {path}") from None
    except ConnectionRefusedError:
        sock.close()
        raise DaemonUnavailable(f"daemon socket {path} refuses connections (stale socket?)") from None
    except (TimeoutError, ProtocolError, OSError) as exc:
        sock.close()
        raise DaemonUnavailable(f"daemon at {path} did not answer hello: {exc}") from None


def is_daemon_starting(paths: DaemonPaths) -> bool:
    """True while some process holds the daemon lock (a daemon is up or coming up)."""
    try:
        fd = os.open(paths.lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def wait_for_daemon(paths: DaemonPaths, *, socket_path: str | os.PathLike[str] | None = None,
                    connect_timeout_s: float = 2.0, state_timeout_s: float = 0.0) -> Client:
    """Connect; while a daemon is starting (lock held), retry up to ``state_timeout_s``."""
    deadline = time.monotonic() + state_timeout_s
    while True:
        try:
            return connect(paths, socket_path=socket_path, timeout_s=connect_timeout_s)
        except DaemonUnavailable as exc:
            starting = socket_path is None and is_daemon_starting(paths)
            if time.monotonic() >= deadline or not (starting or socket_path):
                if starting:
                    raise DaemonUnavailable(f"{exc}; a daemon holds the lock but was not ready "
                                            f"within state_timeout_s={state_timeout_s}") from None
                raise
            time.sleep(0.05)


def ensure_daemon(paths: DaemonPaths, *, timeout_s: float = 15.0) -> Client:
    """Connect, starting a detached daemon (own session, log in the socket dir) if none runs."""
    import subprocess
    import sys

    from .paths import ensure_socket_dir

    try:
        return connect(paths)
    except DaemonUnavailable:
        pass
    if not is_daemon_starting(paths):
        ensure_socket_dir(paths.directory)
        with open(paths.log, "ab") as log:
            # --detach double-forks: the daemon is not our descendant, so engines that kill
            # their whole process tree on exit (vLLM does) leave it running
            subprocess.run([sys.executable, "-m", "hotweights", "daemon", "--detach", "--socket-dir",
                            str(paths.directory)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                           close_fds=True, check=False, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return connect(paths)
        except DaemonUnavailable as exc:
            if time.monotonic() > deadline:
                tail = paths.log.read_text(errors="replace").splitlines()[-5:] if paths.log.exists() else []
                raise DaemonUnavailable(f"could not start the daemon ({exc}); last lines of {paths.log}: "
                                        + " | ".join(tail)) from None
            time.sleep(0.05)
