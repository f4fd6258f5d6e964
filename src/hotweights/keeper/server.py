"""The keeper's process: lock, socket, the accept loop and one thread per connection.

The design header is ``keeper/__init__.py``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import evidence
from ..errors import DaemonAlreadyRunning, ProtocolError
from ..paths import DaemonPaths, ensure_socket_dir
from ..protocol import Error, Message, StopOk, decode, send_message
from ..unix import lock_holder, peer_credentials, take_pid_lock
from ..wire import close_fds, recv_body, recv_header, wait_for_frame
from .limits import Connections, Limits, Phase, Warnings, short
from .fdstore import passed_fds, restore
from .linger import Refuser, drain_and_close, try_send
from .ops import Ops
from .process import trim_heap, tune_process

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

logger = logging.getLogger("hotweights.daemon")  # the name in the daemon log users read

_UNSYNCABLE = {"frame_too_large", "truncated", "too_many_fds", "slow_frame"}  # the stream is out of step


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    paths: DaemonPaths
    max_bytes: int = 0  # 0 = no budget
    limits: Limits = field(default_factory=Limits)
    metrics_port: int = 0  # 0 = no /metrics (keeper/metrics.py)
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {self.max_bytes}")


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.limits = config.limits
        self.warnings = Warnings(logger)
        self.ops = Ops(max_bytes=config.max_bytes, warnings=self.warnings, on_stop=self.stop)
        self.registry = self.ops.registry
        self.connections = Connections(max_connections=self.limits.max_connections,
                                       max_per_pid=self.limits.max_connections_per_pid, stall_s=self.limits.stall_s)
        self._refuser: Refuser | None = None
        self._large_frame = threading.Lock()  # one frame over small_frame_bytes read and decoded at a time
        self._stopping = threading.Event()
        self._lock_fd = -1
        self._reserve_fd = -1  # given up when the fd table is full, to accept and shed a connection
        self._listener: socket.socket | None = None
        self._socket_ino = 0
        self._metrics_server: WSGIServer | None = None
        self.restart = False  # stopped to be restarted by the service manager (``Stop.restart``)

    # -- lifecycle ------------------------------------------------------------------

    def open(self) -> None:
        """Take the lock, bind the socket. Raises DaemonAlreadyRunning or TrustError."""
        paths = self.config.paths
        ensure_socket_dir(paths.directory)
        self.take_lock()
        if paths.socket.exists() or paths.socket.is_symlink():
            logger.info("removing stale socket: path=%s", paths.socket)
            paths.socket.unlink()
        self.listen(paths.socket)

    def take_lock(self, wait_s: float = 0.0) -> None:
        """The daemon lock (one daemon per directory), waiting up to ``wait_s`` for its holder to exit."""
        paths = self.config.paths
        try:
            self._lock_fd = take_pid_lock(paths.lock, wait_s=wait_s)
        except BlockingIOError:
            raise DaemonAlreadyRunning(
                f"another weight cache daemon (pid {lock_holder(paths.lock) or '?'}) already serves "
                f"{paths.directory}; use it, stop it with `hotweights stop`, or take its place with "
                f"`hotweights daemon --replace`") from None

    def listen(self, path: Path, *, publish_as: Path | None = None) -> None:
        """Bind and listen at ``path`` (owner-only); ``publish_as``: then rename it over that path, so that
        new connections reach this daemon at once (a hand-off)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        listener.listen(1024)  # the kernel caps it at net.core.somaxconn
        listener.settimeout(0.2)
        if publish_as is not None:
            os.rename(path, publish_as)
            path = publish_as
        self._socket_ino = os.stat(path).st_ino
        self._listener = listener

    def serve_forever(self) -> None:
        assert self._listener is not None, "open() first"
        logger.info("keeper process: %s", tune_process())
        for line in restore(passed_fds(), self.ops.restore):  # entries kept by a service manager (a crash)
            logger.info("fd store: %s", line)
        if self.config.metrics_port:
            from .metrics import Metrics

            self.ops.metrics = Metrics(self._snapshot)
            self._metrics_server = self.ops.metrics.serve(self.config.metrics_port, self.config.metrics_host)
            self.ops.metrics_address = f"{self.config.metrics_host}:{self.config.metrics_port}"
            logger.info("metrics: http://%s/metrics", self.ops.metrics_address)
        self._refuser = Refuser()
        self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        logger.info(evidence.daemon_ready(str(self.config.paths.socket), os.getpid()))
        self.ops.store.notify(f"READY=1\nSTATUS=serving {len(self.registry.describe()[0])} entries")
        try:
            while not self._stopping.is_set():
                if self._reserve_fd < 0:  # given up in a shortage: take it back as soon as fds free up
                    with contextlib.suppress(OSError):
                        self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE):
                        self.warnings.warn("accept", "accept failed: errno=%d reason=%s", exc.errno, exc)
                        continue
                    self._shed_for_fds()
                    continue
                try:
                    self._admit(conn)
                except Exception as exc:  # a peer must never end the accept loop
                    self.warnings.warn("connection", "connection dropped: error=%r", exc)
                    conn.close()
        finally:
            self.close()

    def _admit(self, conn: socket.socket) -> None:
        assert self._refuser is not None, "serve_forever() sets it up"
        pid, uid = peer_credentials(conn)
        if uid != os.getuid():
            self.warnings.warn("connection", "connection rejected: peer_uid=%d peer_pid=%d reason=uid-mismatch",
                               uid, pid)
            self._refuser.refuse(conn, Error("forbidden", f"uid {uid} may not use the daemon of uid {os.getuid()}"))
            return
        refusal = self.connections.admit(conn, pid)
        if refusal:
            self.warnings.warn("connection", "connection rejected: peer_pid=%d reason=%s", pid, refusal)
            self._refuser.refuse(conn, Error("busy", refusal))
            return
        try:
            threading.Thread(target=self._serve_connection, args=(conn, pid), daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: shed this connection, keep serving
            self.connections.leave(conn)
            self.warnings.warn("connection", "connection rejected: peer_pid=%d reason=%s", pid, exc)
            conn.close()

    def _shed_for_fds(self) -> None:
        """The fd table is full: drop stalled connections (they may hold fds in flight),
        then accept and close one pending connection with the reserve fd."""
        assert self._listener is not None
        shed = self.connections.shed_stalled()
        if self._reserve_fd >= 0:
            os.close(self._reserve_fd)
            self._reserve_fd = -1
        try:
            conn, _ = self._listener.accept()
            conn.close()
        except OSError:
            pass
        try:
            self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # another thread took the slot: try again at the next shortage
            self._reserve_fd = -1
        self.warnings.warn("fds", "fd table full: shed %d stalled connections and one new one; serving goes on "
                           "(connections=%d)", shed, len(self.connections))
        time.sleep(0.01)

    def stop(self, *, restart: bool = False) -> None:
        self.restart = restart
        self._stopping.set()

    def _snapshot(self) -> dict[str, Any]:
        entries, per_device, _parked = self.registry.describe()
        return {"entries": entries, "bytes_by_device": per_device, "clients": len(self.connections),
                "max_bytes": self.config.max_bytes}

    def close(self) -> None:
        if self._metrics_server is not None:  # its port is free before the lock: a successor may take both
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
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

    def _serve_connection(self, conn: socket.socket, pid: int) -> None:
        with conn:
            try:
                while not self._stopping.is_set() and self._serve_one(conn, pid):
                    pass
            except Exception as exc:  # a bug must cost this connection, never the daemon
                self.warnings.warn("internal", "connection failed: peer_pid=%d error=%r", pid, exc)
            finally:
                self.connections.leave(conn)

    def _serve_one(self, conn: socket.socket, peer_pid: int) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            conn.settimeout(self.limits.idle_timeout_s)
            if not wait_for_frame(conn):
                return False
            self.connections.enter(conn, Phase.RECEIVING)
            msg, fds = self._read_request(conn)
        except (EOFError, TimeoutError, OSError):
            return False
        except ProtocolError as exc:
            self.warnings.warn("request", "request rejected: peer_pid=%d code=%s reason=%s", peer_pid, exc.code, exc)
            try_send(conn, Error(exc.code, str(short(exc, 1000))))
            if exc.code in _UNSYNCABLE:
                drain_and_close(conn)
                return False
            self.connections.enter(conn, Phase.IDLE)
            return True
        self.connections.enter(conn, Phase.SERVING)
        out_fds: list[int] = []
        try:
            reply, out_fds = self.ops.handle(msg, fds, peer_pid)
        except Exception as exc:  # a bug in a handler must not take the daemon down
            self.warnings.warn("internal", "request failed: peer_pid=%d op=%s error=%r", peer_pid,
                               type(msg).__name__, exc)
            reply = Error("internal", f"daemon error: {short(exc, 500)}")
        try:
            try:
                send_message(conn, reply, out_fds)
            except ProtocolError as exc:  # the reply itself broke a limit: say so instead
                send_message(conn, Error("reply_too_large", str(exc)))
        except OSError:
            return False
        finally:
            close_fds(out_fds)
        self.connections.enter(conn, Phase.IDLE)
        return not isinstance(reply, StopOk)

    def _read_request(self, conn: socket.socket) -> tuple[Message, list[int]]:
        deadline = time.monotonic() + self.limits.frame_timeout_s
        length, fds = recv_header(conn, deadline=deadline)
        try:
            large = length > self.limits.small_frame_bytes
            if large and not fds:
                raise ProtocolError(f"frame of {length} bytes without fds; only a publish (which carries fds) may "
                                    f"exceed {self.limits.small_frame_bytes} bytes", code="frame_too_large")
            if large and not self._large_frame.acquire(timeout=self.limits.large_frame_wait_s):
                raise ProtocolError("another large frame is being read; retry", code="frame_too_large")
            try:
                return decode(recv_body(conn, length, deadline=deadline)), fds
            finally:
                if large:
                    self._large_frame.release()
                    trim_heap()
        except BaseException:
            close_fds(fds)
            raise
