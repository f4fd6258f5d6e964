"""The keeper daemon: holds pool fds and manifests, answers requests, owns lifecycle.

Pure Python: no torch, no CUDA context, no GPU memory of its own. One daemon per user
per socket directory, guaranteed by an ``flock`` on ``daemon.lock`` held for the
daemon's life; only the lock holder removes a stale ``daemon.sock``. Every connection
is checked with ``SO_PEERCRED``: another uid is logged and closed. A bad request gets a
typed ``error`` reply and one warning line, and the daemon goes on serving; a frame
that cannot be re-synchronised (oversized, truncated) also closes that connection.

Lifetime: published fds belong to the registry; attach replies carry dups that are
closed here right after ``sendmsg`` (the kernel holds them in flight).

Not covered: remote clients (same host, same user only) and memory budgets per user
beyond ``max_bytes``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

from . import __version__, evidence
from .errors import DaemonAlreadyRunning, ProtocolError
from .manifest import Manifest
from .paths import DaemonPaths, ensure_socket_dir
from .protocol import (
    PROTOCOL_VERSION, Attach, AttachMismatch, AttachMiss, AttachOk, Error, Hello, HelloOk,
    Message, Publish, PublishOk, Release, ReleaseOk, Status, StatusOk, Stop, StopOk,
    recv_message, send_message,
)
from .registry import Registry, check_pool_fds
from .wire import close_fds

logger = logging.getLogger(__name__)

_UNSYNCABLE = {"bad_frame", "frame_too_large", "truncated", "too_many_fds"}
_MAX_CONNECTIONS = 64


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    paths: DaemonPaths
    max_bytes: int = 0  # 0 = no budget
    idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {self.max_bytes}")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s}")


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.registry = Registry()
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._lock_fd = -1
        self._listener: socket.socket | None = None
        self._socket_ino = 0

    # -- lifecycle ------------------------------------------------------------------

    def open(self) -> None:
        """Take the lock, bind the socket. Raises DaemonAlreadyRunning or TrustError."""
        paths = self.config.paths
        ensure_socket_dir(paths.directory)
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DaemonAlreadyRunning(
                f"another weight cache daemon (pid {holder}) already serves {paths.directory}; "
                f"use it, or stop it with `hotweights stop`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        if paths.socket.exists() or paths.socket.is_symlink():
            logger.info("removing stale socket: path=%s", paths.socket)
            paths.socket.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(paths.socket))
        finally:
            os.umask(old_umask)
        os.chmod(paths.socket, 0o600)
        self._socket_ino = os.stat(paths.socket).st_ino
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener

    def serve_forever(self) -> None:
        assert self._listener is not None, "open() first"
        logger.info(evidence.daemon_ready(str(self.config.paths.socket), os.getpid()))
        try:
            while not self._stopping.is_set():
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                if not self._slots.acquire(blocking=False):
                    logger.warning("connection rejected: reason=too-many-connections limit=%d", _MAX_CONNECTIONS)
                    conn.close()
                    continue
                threading.Thread(target=self._serve_connection, args=(conn,), daemon=True).start()
        finally:
            self.close()

    def stop(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        released = self.registry.release(None)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            sock = self.config.paths.socket
            try:
                if os.stat(sock).st_ino == self._socket_ino:
                    sock.unlink()
            except FileNotFoundError:
                pass
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        logger.info("Weight cache daemon stopped: pid=%d released=%d", os.getpid(), len(released))

    # -- connections ----------------------------------------------------------------

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid != os.getuid():
                    logger.warning("connection rejected: peer_uid=%d peer_pid=%d reason=uid-mismatch", uid, pid)
                    _try_send(conn, Error("forbidden", f"uid {uid} may not use the daemon of uid {os.getuid()}"))
                    _drain_and_close(conn)
                    return
                conn.settimeout(self.config.idle_timeout_s)
                while not self._stopping.is_set():
                    if not self._serve_one(conn, pid):
                        return
        finally:
            self._slots.release()

    def _serve_one(self, conn: socket.socket, peer_pid: int) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            msg, fds = recv_message(conn)
        except (EOFError, TimeoutError, ConnectionError):
            return False
        except ProtocolError as exc:
            logger.warning("request rejected: peer_pid=%d code=%s reason=%s", peer_pid, exc.code, exc)
            _try_send(conn, Error(exc.code, str(exc)))
            if exc.code in _UNSYNCABLE:
                _drain_and_close(conn)
                return False
            return True
        out_fds: list[int] = []
        try:
            reply, out_fds = self._handle(msg, fds, peer_pid)
        except Exception as exc:  # a bug in a handler must not take the daemon down
            logger.exception("request failed: peer_pid=%d op=%s", peer_pid, type(msg).__name__)
            reply = Error("internal", f"daemon error: {exc}")
        try:
            send_message(conn, reply, out_fds)
        except OSError:
            return False
        finally:
            close_fds(out_fds)
        return not isinstance(reply, StopOk)

    def _handle(self, msg: Message, fds: list[int], peer_pid: int) -> tuple[Message, list[int]]:
        if not isinstance(msg, Publish) and fds:
            close_fds(fds)
            return Error("bad_message", f"op {type(msg).__name__} takes no fds, got {len(fds)}"), []
        if isinstance(msg, Hello):
            if msg.version != PROTOCOL_VERSION:
                return Error("version", f"client speaks protocol {msg.version}, daemon {PROTOCOL_VERSION}; "
                                        f"use matching hotweights versions"), []
            return HelloOk(PROTOCOL_VERSION, __version__, os.getpid()), []
        if isinstance(msg, Status):
            entries, per_device = self.registry.describe()
            return StatusOk(os.getpid(), __version__, time.monotonic() - self.started, entries, per_device,
                            "torch" in sys.modules), []
        if isinstance(msg, Attach):
            return self._attach(msg, peer_pid)
        if isinstance(msg, Publish):
            return self._publish(msg.manifest, fds, peer_pid), []
        if isinstance(msg, Release):
            if not msg.all and not msg.key_short:
                return Error("bad_message", "release needs a key or all=true"), []
            released = self.registry.release(None if msg.all else msg.key_short)
            logger.info("released: keys=%s peer_pid=%d", ",".join(released) or "-", peer_pid)
            return ReleaseOk(released), []
        if isinstance(msg, Stop):
            logger.info("stop requested: peer_pid=%d", peer_pid)
            self.stop()
            return StopOk(), []
        return Error("bad_message", f"{type(msg).__name__} is a reply, not a request"), []

    def _attach(self, msg: Attach, peer_pid: int) -> tuple[Message, list[int]]:
        found = self.registry.lookup(msg.key)
        if found is not None:
            manifest, dups = found
            logger.info("attach served: key=%s peer_pid=%d tensors=%d pools=%d", msg.key.short, peer_pid,
                        len(manifest.tensors), len(manifest.pools))
            return AttachOk(manifest), dups
        closest = self.registry.closest(msg.key)
        if closest is None:
            logger.info("attach miss: key=%s peer_pid=%d reason=empty", msg.key.short, peer_pid)
            return AttachMiss(f"the daemon holds no entries (requested {msg.key.short})"), []
        manifest, diffs = closest
        logger.info("attach mismatch: key=%s peer_pid=%d closest=%s diffs=%d", msg.key.short, peer_pid,
                    manifest.key.short, len(diffs))
        return AttachMismatch(manifest.key.model, manifest.key.short, diffs), []

    def _publish(self, manifest: Manifest, fds: list[int], peer_pid: int) -> Message:
        taken = False
        try:
            problem = check_pool_fds(manifest, fds)
            if problem:
                logger.warning("publish rejected: peer_pid=%d key=%s reason=%s", peer_pid, manifest.key.short, problem)
                return Error("bad_manifest", problem)
            taken = True
            refusal = self.registry.add(manifest, fds, max_bytes=self.config.max_bytes)
            if refusal is not None:
                logger.warning("publish rejected: peer_pid=%d key=%s reason=%s", peer_pid, manifest.key.short,
                               refusal[0])
                return Error(*refusal)
            key = manifest.key
            logger.info(evidence.published(len(manifest.tensors), manifest.tensor_nbytes, key.model, key.short,
                                           key.device, manifest.load_s))
            return PublishOk(key.short)
        finally:
            if not taken:
                close_fds(fds)


def _drain_and_close(conn: socket.socket) -> None:
    """Close after an error reply without a TCP-style reset: closing with unread input
    makes the kernel discard our reply (ECONNRESET at the peer), so read what is pending first."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.5)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass


def _try_send(conn: socket.socket, msg: Message) -> None:
    try:
        send_message(conn, msg)
    except OSError:
        pass


def detach() -> None:
    """Double-fork into the background: the daemon is then no descendant of the caller,
    so an engine that kills its process tree on exit (vLLM does) leaves it running."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)


def run(config: DaemonConfig) -> int:
    """Entry point of ``hotweights daemon``: serve until stop, SIGINT or SIGTERM."""
    daemon = Daemon(config)
    daemon.open()

    def _on_signal(signum: int, _frame: object) -> None:
        logger.info("signal received: signum=%d; shutting down", signum)
        daemon.stop()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    daemon.serve_forever()
    return 0
