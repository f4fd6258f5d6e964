"""The only door to the daemon: connect, hello, status, attach, publish, release, stop.

``connect_for(config)`` turns an engine-side ``AttachConfig`` into a connection (the
socket path, else the socket directory's lookup order; waiting for a starting daemon in
strict mode; starting one for a publish). Everything else that talks to the daemon goes
through a ``Client``, and callers read outcomes (``Outcome``, ``Answer``), never raw
protocol replies.

Stdlib + msgpack only (no torch): the CLI's ``status``/``release``/``stop`` stay fast.
Fds handed out by an ``AttachReply`` belong to the caller, who must close them (the
pool importers do). An ``error`` reply is raised as ``ProtocolError`` carrying its code.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .config import AttachConfig
from .errors import DaemonUnavailable, ProtocolError, TrustError
from .key import CacheKey
from .manifest import Manifest
from .paths import DaemonPaths, check_socket_dir, daemon_paths
from .protocol import (
    PROTOCOL_VERSION, Attach, Describe, DescribeOk, Error, Hello, HelloOk, Lookup, LookupOk, Message, Park,
    ParkOk, Publish, PublishOk, Release, ReleaseOk, Status, StatusOk, Stop, StopOk, recv_message, send_message,
)
from .replies import Answer, AttachReply, Outcome, answer_of
from .rows import EntryRow
from .unix import is_locked, peer_credentials
from .wire import close_fds, recv_frame

R = TypeVar("R")  # the reply type a request expects

__all__ = ["Answer", "AttachReply", "Client", "Outcome", "connect", "connect_for", "ensure_daemon", "wait_for_daemon"]


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

    def _expect(self, msg: Message, cls: type[R]) -> R:
        reply, fds = self.request(msg)
        if fds or not isinstance(reply, cls):
            close_fds(fds)
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to {type(msg).__name__}", code="bad_reply")
        return reply

    def hello(self) -> HelloOk:
        return self._expect(Hello(PROTOCOL_VERSION), HelloOk)

    def status(self) -> StatusOk:
        return self._expect(Status(), StatusOk)

    def attach(self, key: CacheKey, tier: str = "device") -> AttachReply:
        """``tier="host"``: the host copy of ``key``'s entry (its fds are memfds, whatever the manifest's device)."""
        send_message(self.sock, Attach(key, tier))
        try:
            payload, fds = recv_frame(self.sock)
        except EOFError:
            raise ProtocolError("the daemon closed the connection without a reply", code="closed") from None
        return AttachReply(key, payload, fds, host=tier == "host")

    def lookup(self, key: CacheKey) -> Answer:
        """Whether ``key`` is served (and its size), without fds and without counting as an attach; a daemon
        from before ``Lookup`` is asked with an attach whose fds are closed unmapped."""
        try:
            reply, fds = self.request(Lookup(key))
        except ProtocolError as exc:
            if exc.code != "unknown_op":
                raise
            return self.attach(key).answer()
        close_fds(fds)
        if isinstance(reply, LookupOk) and reply.key_short == key.short:
            return Answer(Outcome.OK, nbytes=reply.nbytes)
        not_served = answer_of(key, reply)
        if not_served is None:
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to a lookup of {key.short}", code="bad_reply")
        return not_served

    def entry(self, key: CacheKey) -> EntryRow | None:
        """The daemon's status row of ``key`` (``hotweights status``), None if it holds none: a look that
        is not an attach (an entry's ``num_attaches`` counts engines)."""
        return next((e for e in self.status().rows() if e.key == key.short), None)

    def entry_nbytes(self, key: CacheKey) -> int:
        """Bytes the daemon holds for ``key`` (what a zero_copy attach maps), 0 if none."""
        return self.lookup(key).nbytes

    def publish(self, manifest: Manifest, fds: list[int], tier: str = "device") -> PublishOk:
        reply, extra = self.request(Publish(manifest, tier), fds)
        close_fds(extra)
        if not isinstance(reply, PublishOk):
            raise ProtocolError(f"unexpected reply {type(reply).__name__} to publish", code="bad_reply")
        return reply

    def release(self, key_short: str | None, tier: str = "") -> ReleaseOk:
        """``tier``: only the ``device`` entry or only its ``host`` copy ('': both)."""
        return self._expect(Release(key_short or "", key_short is None, tier), ReleaseOk)

    def describe(self, key_short: str) -> Manifest:
        """The manifest of the entry ``key_short`` names (its full key), without fds and without an attach."""
        return self._expect(Describe(key_short), DescribeOk).manifest

    def park(self, key: CacheKey, level: int, held_bytes: int) -> None:
        """Tell the daemon this process is parked on ``key`` at ``level`` (0: awake again), holding ``held_bytes``."""
        self._expect(Park(key, level, held_bytes), ParkOk)

    def stop(self, *, restart: bool = False) -> None:
        """``restart``: under a service manager, exit to be started again with the entries (``Stop``)."""
        self._expect(Stop(restart=restart), StopOk)


def connect(paths: DaemonPaths, *, socket_path: str | os.PathLike[str] | None = None,
            timeout_s: float = 2.0) -> Client:
    """Connect, authenticate the daemon, say hello.

    Before a byte (or an fd) is sent: the socket's directory must be a private directory
    of this user, and the process that answers must run as this user (``SO_PEERCRED``);
    TrustError otherwise. DaemonUnavailable says why no daemon answered. A daemon that
    answered the connect but shed it (all its slots busy, ``is_transient``) is asked again
    until ``timeout_s``: it is up, only busy.
    """
    path = Path(socket_path) if socket_path else paths.socket
    try:
        check_socket_dir(path.parent)
    except FileNotFoundError:
        raise DaemonUnavailable(f"no daemon socket at {path}") from None
    deadline = time.monotonic() + timeout_s
    for attempt in itertools.count():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout_s)
        try:
            _connect_patiently(sock, str(path), deadline)
            pid, uid = peer_credentials(sock)
            if uid != os.getuid():
                raise TrustError(f"the daemon at {path} (pid {pid}) runs as uid {uid}, not as you (uid "
                                 f"{os.getuid()}): refusing to send it anything; stop it, or use a daemon of your "
                                 f"own with --socket-dir")
            client = Client(sock, path)
            client.hello()
            return client
        except TrustError:
            sock.close()
            raise
        except FileNotFoundError:
            sock.close()
            raise DaemonUnavailable(f"no daemon socket at {path}") from None
        except ConnectionRefusedError:
            sock.close()
            raise DaemonUnavailable(f"daemon socket {path} refuses connections (stale socket?)") from None
        except (TimeoutError, ProtocolError, OSError) as exc:
            sock.close()
            if is_transient(exc) and time.monotonic() < deadline:
                backoff(attempt)
                continue
            raise DaemonUnavailable(f"daemon at {path} did not answer hello: {exc}") from None
    raise AssertionError("unreachable")


def is_transient(exc: BaseException) -> bool:
    """A failure of the connection, not an answer: the daemon shed it (busy) or it broke in transit.
    Asked again within the caller's deadline; never read as a cache miss."""
    if isinstance(exc, ProtocolError):
        return exc.code in ("busy", "closed")
    return isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, EOFError))


def backoff(attempt: int) -> None:
    """Sleep before try ``attempt + 1``: 2 ms doubling to 50 ms, jittered (threads that collided spread out)."""
    time.sleep(min(0.05, 0.002 * 2 ** attempt) * (0.5 + random.random()))


def _connect_patiently(sock: socket.socket, path: str, deadline: float) -> None:
    # a full listen backlog answers EAGAIN at once on Unix sockets: the daemon is up and
    # busy accepting, so wait for it rather than call it absent
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError("the daemon's listen backlog stayed full") from None
            time.sleep(0.005)


def connect_for(config: AttachConfig, *, start: bool = False) -> Client:
    """The connection an engine-side config names: ``socket_path``, else ``socket_dir``.

    Strict configs (``fallback: false``) wait up to ``state_timeout_s`` for a daemon
    that is starting. ``start`` (publishers) starts a detached daemon when none runs;
    a daemon named by ``socket_path`` is never started, only waited for.
    """
    paths = daemon_paths(config.socket_dir)
    if start and not config.socket_path:
        return ensure_daemon(paths)
    return wait_for_daemon(paths, socket_path=config.socket_path, connect_timeout_s=config.connect_timeout_s,
                           state_timeout_s=0.0 if config.fallback and not start else config.state_timeout_s)


def is_daemon_starting(paths: DaemonPaths) -> bool:
    """True while some process holds the daemon lock (a daemon is up or coming up)."""
    return is_locked(paths.lock)


def _retry(attempt: Callable[[], Client], deadline: float, keep_trying: Callable[[], bool],
           give_up: Callable[[DaemonUnavailable], DaemonUnavailable]) -> Client:
    while True:
        try:
            return attempt()
        except DaemonUnavailable as exc:
            if time.monotonic() >= deadline or not keep_trying():
                raise give_up(exc) from None
            time.sleep(0.05)


def wait_for_daemon(paths: DaemonPaths, *, socket_path: str | os.PathLike[str] | None = None,
                    connect_timeout_s: float = 2.0, state_timeout_s: float = 0.0) -> Client:
    """Connect; while a daemon is starting (lock held, or an explicit socket path not yet
    answering), retry up to ``state_timeout_s``."""
    def give_up(exc: DaemonUnavailable) -> DaemonUnavailable:
        if socket_path is None and is_daemon_starting(paths):
            return DaemonUnavailable(f"{exc}; a daemon holds the lock but was not ready "
                                     f"within state_timeout_s={state_timeout_s}")
        return exc

    return _retry(lambda: connect(paths, socket_path=socket_path, timeout_s=connect_timeout_s),
                  time.monotonic() + state_timeout_s,
                  lambda: bool(socket_path) or is_daemon_starting(paths), give_up)


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

    def give_up(exc: DaemonUnavailable) -> DaemonUnavailable:
        tail = paths.log.read_text(errors="replace").splitlines()[-5:] if paths.log.exists() else []
        return DaemonUnavailable(f"could not start the daemon ({exc}); last lines of {paths.log}: " + " | ".join(tail))

    return _retry(lambda: connect(paths), time.monotonic() + timeout_s, lambda: True, give_up)
