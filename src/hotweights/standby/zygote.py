"""The standby process: an engine's Python with the engine imported, no CUDA, waiting for one start.

``python -m hotweights.standby.zygote --engine NAME --socket-dir D``, started detached by the launcher
(``handoff.prepare``). It takes the lock ``<engine>-standby-<tag>.lock`` (one standby per engine, interpreter,
``CUDA_VISIBLE_DEVICES``, socket directory and place: with ``--places N``, the first free of N), waits until the
start it follows is ready (``--after-pid``, ``--after-url``: the two must not compete for the CPU, and a niceness
would be inherited by the server it forks), imports what the engine's ``EngineSpec`` names, then answers on its
socket (the peer's uid must be its own).

States (``TRANSITIONS``): importing -> ready -> handed_over (it forked the server, having given up its
socket and lock so the launcher can prepare the next standby; it stays as the server's supervisor,
reports the exit code and ends the server's process group when the launcher goes away; the server
dies with it too, ``PR_SET_PDEATHSIG``) or retired (asked to stop, or its socket was removed).

Fork safety, checked before every fork and reported in ``Ready``: no CUDA context; one Python thread
(no Python lock is held by a thread the child does not get; the accept loop is single-threaded by
design); no event loop. Native threads may exist: OpenBLAS's pool shuts itself down around ``fork``
(``pthread_atfork``). The child takes the launcher's environment, working directory, stdio and process
title before the engine's code runs, as ``python -m MODULE ARGS`` has; the fingerprint pins the rest.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import enum
import importlib
import logging
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from ..errors import ProtocolError
from ..observe import healthy
from ..paths import ensure_socket_dir
from ..unix import (drop_lock_note, peer_credentials, pid_alive, set_process_title, signal_group, stop_group,
                    take_pid_lock, write_lock_note)
from ..wire import close_fds
from .engine import EngineSpec, spec
from .handoff import standby_paths
from .messages import Exited, Hello, Ready, Start, Started, Stop, receive, send

logger = logging.getLogger("hotweights.standby")
GRACE_S = 30.0  # from SIGTERM to SIGKILL when the launcher is gone
AFTER_MAX_S = 600.0  # the longest the standby waits for the start it follows before it imports


class State(enum.Enum):
    IMPORTING = "importing"
    READY = "ready"
    HANDED_OVER = "handed_over"
    RETIRED = "retired"


TRANSITIONS = {(State.IMPORTING, "imported"): State.READY, (State.READY, "start"): State.HANDED_OVER,
               (State.READY, "stop"): State.RETIRED, (State.READY, "socket_removed"): State.RETIRED}


class Standby:
    def __init__(self, engine: EngineSpec, directory: Path, place: int = 0) -> None:
        self.engine, self.paths = engine, standby_paths(directory, engine.name, place=place)
        self.state = State.IMPORTING
        self.ready: Ready | None = None
        self.lock = -1
        self.listener: socket.socket | None = None

    def move(self, event: str) -> None:
        after = TRANSITIONS.get((self.state, event))
        if after is None:
            raise RuntimeError(f"standby: {event!r} is not allowed in state {self.state.value}")
        self.state = after

    def give_up_place(self) -> None:
        """Unlink the socket (while holding the lock: only the holder removes it), close it, free the lock."""
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        if self.listener is not None:
            self.listener.close()
        if self.lock >= 0:
            drop_lock_note(self.paths.lock)  # while it still holds the lock: the next holder writes its own
            os.close(self.lock)
            self.lock = -1


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(prog="python -m hotweights.standby.zygote")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--socket-dir", required=True)
    parser.add_argument("--after-pid", type=int, default=0, help="import only once this start is ready or gone")
    parser.add_argument("--after-url", default="", help="that start's health URL")
    parser.add_argument("--places", type=int, default=1, help="take the first free of this many places")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    directory = Path(args.socket_dir)
    ensure_socket_dir(directory)
    standby = _take_a_place(spec(args.engine), directory, args.places)
    if standby is None:
        return 0
    if args.after_pid:  # what it does now, for a start that asks (``busy.wait_while_importing``)
        write_lock_note(standby.paths.lock, "waiting", str(args.after_pid), args.after_url or "-")
        logger.info("waiting for the start in progress (pid %d) to be ready: %s", args.after_pid,
                    _wait_for(args.after_pid, args.after_url))
    write_lock_note(standby.paths.lock, "importing")
    stamp = standby.engine.fingerprint()  # before the imports: what they were made from
    start = time.perf_counter()
    missing = _preimport(standby.engine)
    imports_s = round(time.perf_counter() - start, 2)
    with contextlib.suppress(FileNotFoundError):
        standby.paths.socket.unlink()  # a stale one: only the lock holder removes it
    listener = standby.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    staged = standby.paths.socket.with_name(standby.paths.socket.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    listener.bind(str(staged))  # bound and listening before it has the socket's name: no refused connection
    os.chmod(staged, 0o600)
    listener.listen(8)
    os.rename(staged, standby.paths.socket)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    standby.ready = Ready(os.getpid(), standby.engine.name, stamp.to_wire(), imports_s, missing, False, 0, 0)
    standby.move("imported")
    write_lock_note(standby.paths.lock, "ready")
    logger.info("%s standby READY: socket=%s pid=%d imports=%.1fs (not in this build: %s)", standby.engine.name,
                standby.paths.socket, os.getpid(), imports_s, ", ".join(missing) or "none")
    listener.settimeout(30.0)
    try:
        while standby.state is State.READY:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if not standby.paths.socket.exists():
                    logger.info("%s was removed; exiting", standby.paths.socket)
                    standby.move("socket_removed")
                continue
            conn.settimeout(None)
            with conn:
                server = _serve(conn, standby)
                if server is not None:
                    return _supervise(conn, server)
        return 0
    finally:
        if standby.state is not State.HANDED_OVER:
            with contextlib.suppress(FileNotFoundError):
                standby.paths.socket.unlink()
            drop_lock_note(standby.paths.lock)  # it holds the lock until it exits


def _take_a_place(engine: EngineSpec, directory: Path, count: int) -> Standby | None:
    """The standby in the first of ``count`` places whose lock it could take (the pid in it: who to stop while still
    importing); None where every place holds one already."""
    for place in range(max(1, count)):
        standby = Standby(engine, directory, place)
        try:
            standby.lock = take_pid_lock(standby.paths.lock)
        except BlockingIOError:
            continue
        return standby
    logger.info("every place of %d holds a standby (%s); exiting", count, standby.paths.lock)
    return None


def _wait_for(pid: int, url: str) -> str:
    """Until the start of ``pid`` answers ``url`` with 200, or exits, or ``AFTER_MAX_S`` pass; what happened."""
    deadline = time.monotonic() + AFTER_MAX_S
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return "it exited"
        if healthy(url, 1.0):
            return "ready"
        time.sleep(0.5)
    return f"not ready after {AFTER_MAX_S:.0f} s; importing anyway"


def _preimport(engine: EngineSpec) -> list[str]:
    missing = []
    for name in engine.preimports:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing + engine.after_imports()


def _fork_safety(ready: Ready) -> Ready:
    torch = sys.modules.get("torch")
    return Ready(ready.pid, ready.engine, ready.fingerprint, ready.imports_s, ready.missing,
                 bool(torch is not None and torch.cuda.is_initialized()), threading.active_count(),
                 len(os.listdir("/proc/self/task")))


def _serve(conn: socket.socket, standby: Standby) -> int | None:
    """Answer one connection; the server's pid once a start was handed over."""
    pid, uid = peer_credentials(conn)
    if uid != os.getuid():
        logger.warning("connection rejected: peer_pid=%d peer_uid=%d reason=uid-mismatch", pid, uid)
        return None
    conn.settimeout(10.0)
    try:
        while True:
            msg, fds = receive(conn, Hello, Start, Stop)
            assert standby.ready is not None
            if isinstance(msg, Hello):
                send(conn, _fork_safety(standby.ready))
            elif isinstance(msg, Stop):
                logger.info("stop requested by pid %d", pid)
                standby.give_up_place()  # before the reply ends: the launcher prepares the next
                standby.move("stop")
                return None
            else:
                assert isinstance(msg, Start)
                safety = _fork_safety(standby.ready)
                if safety.cuda_initialized or safety.threads != 1 or len(fds) != 3:
                    close_fds(fds)
                    logger.error("start refused: cuda_initialized=%s threads=%d fds=%d", safety.cuda_initialized,
                                 safety.threads, len(fds))
                    return None
                standby.give_up_place()  # before the fork: the child never holds the lock, the next standby may
                standby.move("start")
                server = _fork_server(msg, fds, conn)
                send(conn, Started(server))
                logger.info("started %s for pid %d: server pid %d, %s %s", standby.engine.name, pid, server,
                            msg.module, " ".join(msg.args))
                return server
    except (EOFError, OSError, ValueError, ProtocolError) as exc:
        logger.info("connection from pid %d ended: %s", pid, exc)
        return None


def _fork_server(msg: Start, fds: list[int], conn: socket.socket) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        close_fds(fds)
        return pid
    code: object = 1
    try:
        os.setpgid(0, 0)  # the launcher signals the group, as a terminal would
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: die with the supervisor
        if os.getppid() != parent:
            os._exit(1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        close_fds(fds)
        os.chdir(msg.cwd)
        os.environ.clear()
        os.environ.update(msg.env)
        sys.path[0] = msg.cwd  # what ``python -m`` puts first
        sys.argv = [msg.module, *msg.args]
        set_process_title(f"{sys.executable} -m {msg.module} {' '.join(msg.args)}")  # in ps, what a plain start shows
        logging.getLogger().handlers.clear()  # the standby's own log handler wrote to its log file
        code = 0
        runpy.run_module(msg.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # the server's own failure: shown as python would show it
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code or 0)  # an int or None by now


def _supervise(conn: socket.socket, server: int) -> int:
    """Until the server exits: end its process group if the launcher goes away; then report its code."""
    pidfd = os.pidfd_open(server)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(conn, select.POLLIN | select.POLLHUP)
    launcher_gone = False
    deadline = None
    while True:
        for fd, _ in poller.poll(1000 if deadline else None):
            if fd == pidfd:
                _, status = os.waitpid(server, 0)
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
                logger.info("server pid %d exited: code=%d", server, code)
                stop_group(server, 5.0)  # what it left in its group (a killed vLLM API server's engine core)
                if not launcher_gone:
                    with contextlib.suppress(OSError):
                        send(conn, Exited(code))
                return 0
            if not launcher_gone and not conn.recv(4096):
                launcher_gone = True
                poller.unregister(conn)
                logger.warning("the launcher went away: stopping server pid %d", server)
                signal_group(server, signal.SIGTERM)
                deadline = time.monotonic() + GRACE_S
        if deadline and time.monotonic() > deadline:
            signal_group(server, signal.SIGKILL)
            deadline = None


if __name__ == "__main__":
    sys.exit(main())
