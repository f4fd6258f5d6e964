"""The launcher's side of a warm standby: find one that fits this start, hand the start over, stay in front.

Runs in the hotweights CLI process (``hotweights vllm serve ...``), before the engine is imported, and
imports nothing of it or of torch. The standby (``zygote.py``) is a process of the same Python with the
engine already imported; it answers on ``<socket dir>/<engine>-standby-<tag>.sock``, one per engine,
interpreter and ``CUDA_VISIBLE_DEVICES`` (``tag``: a digest of the interpreter's path and that value, which
pins a standby: engines on GPUs of their own, as ``hotweights switch`` places them, keep one each). The
socket directory is the daemon's: the same trust rules hold (a private directory of this user; the peer's
uid is checked both ways).

``HOTWEIGHTS_STANDBYS=N`` (1 by default, at most ``MAX_PLACES``) keeps up to N standbys of an engine, interpreter and
``CUDA_VISIBLE_DEVICES``, each in a place of its own (place 0 has the names above, place K ``...-<tag>-K.sock``):
``hotweights switch`` starts several engines at once, and with one standby the others imported the engine
themselves (on an H200, 33.7-36.9 s per 8B start against 16.3-18.6 s from the standby). A start takes a ready
standby first, else waits for one importing that no other start has claimed; each start prepares one in the first
free place.

A standby is used only when its fingerprint equals this launcher's (``fingerprint.py``); otherwise,
or when none answers in time, the start is a plain one and says why in one line, naming the fields
that differ. A standby that crashed, hung or was killed costs at most that plain start.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HotweightsError, ProtocolError, TrustError
from ..paths import check_socket_dir
from ..unix import (descendants, is_locked, lock_holder, lock_note, peer_credentials, pid_alive, proc_stat,
                    spawn_detached, take_pid_lock)
from ..wire import close_fds
from .busy import wait_while_importing
from .engine import EngineSpec
from .fingerprint import Fingerprint
from .messages import Exited, Hello, Ready, Start, Started, Stop, receive, send

logger = logging.getLogger(__name__)
DISABLE_ENV = "HOTWEIGHTS_VLLM_STANDBY"  # "off": never use or prepare a standby
IMPORT_ENV = "HOTWEIGHTS_STANDBY_IMPORT"  # "now": the next start's standby imports beside this start, not after it
PLACES_ENV = "HOTWEIGHTS_STANDBYS"  # how many standbys are kept, each in a place of its own (``places``)
MAX_PLACES = 8


class StandbyUnusable(HotweightsError):
    """No standby can take this start; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class StandbyPaths:
    socket: Path
    lock: Path
    log: Path
    claim: Path  # held by the one launcher taking (or waiting for) the standby


def standby_paths(directory: Path, engine: str = "vllm", python: str | None = None,
                  devices: str | None = None, place: int = 0) -> StandbyPaths:
    """The files of the standby in ``place`` for ``python`` (this one by default) and ``devices``
    (``CUDA_VISIBLE_DEVICES``, this process's by default; "" for unset)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "") if devices is None else devices
    seed = os.path.realpath(python or sys.executable) + (f"\0{devices}" if devices else "")
    tag = hashlib.blake2b(seed.encode(), digest_size=4).hexdigest() + (f"-{place}" if place else "")
    return StandbyPaths(*(directory / f"{engine}-standby-{tag}.{ext}" for ext in ("sock", "lock", "log", "claim")))


def places(environ: dict[str, str]) -> int:
    """How many standbys are kept (``HOTWEIGHTS_STANDBYS``): 1 where it is unset or not a number, at most
    ``MAX_PLACES``."""
    try:
        return min(MAX_PLACES, max(1, int(environ.get(PLACES_ENV, "1"))))
    except ValueError:
        return 1


@dataclass(slots=True)
class Server:
    """A server a standby started for this launcher."""

    conn: Any  # the connection to its standby, which reports the exit code
    pid: int
    imports_s: float

    def wait(self) -> int:
        """Relay SIGINT, SIGTERM and SIGHUP to the server's process group until it exits; its exit code."""

        def relay(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, relay)
        self.conn.settimeout(None)
        try:
            msg, _ = receive(self.conn, Exited)
            assert isinstance(msg, Exited)
            return msg.code
        except (EOFError, OSError, ProtocolError) as exc:
            # the standby died: the server got SIGTERM with it (PR_SET_PDEATHSIG); wait until it is gone
            logger.error("the standby supervising pid %d went away (%s); waiting for the server to end", self.pid, exc)
            while pid_alive(self.pid):
                time.sleep(0.2)
            return 1
        finally:
            self.conn.close()


def serving_pids(pid: int, server: int = 0) -> list[int]:
    """``pid`` (a launcher, or the server itself) with its descendants and, where the start was handed to a warm
    standby (``server``: its pid, ``evidence.standby_server`` of the start's output), the server's process tree
    too: a child of the standby, not of the launcher. What a start's memory is counted over and the keeper's
    attach records are matched to."""
    pids = [pid, *descendants(pid)]
    if server and server not in pids and pid_alive(server):
        pids += [server, *descendants(server)]
    return pids


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _trusted(directory: Path) -> None:
    """The standby's directory is a private one of this user (StandbyUnusable says why not)."""
    try:
        check_socket_dir(directory)
    except FileNotFoundError:
        raise StandbyUnusable(f"no standby prepared yet (no {directory})") from None
    except TrustError as exc:
        raise StandbyUnusable(f"untrusted socket dir: {exc}") from None


def _hello(engine: EngineSpec, directory: Path, connect_timeout_s: float,
           reply_timeout_s: float, place: int = 0) -> tuple[Any, Ready, list[str]]:
    """A trusted connection to the standby of this engine and interpreter in ``place``, its ``Ready`` and the
    fields where its fingerprint differs from this launcher's; StandbyUnusable says why there is none."""
    import socket

    paths = standby_paths(directory, engine.name, place=place)
    _trusted(directory)
    wait_while_importing(paths.lock, paths.socket)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(connect_timeout_s)
    with _unusable_on_failure(sock, "standby unreachable"):
        try:
            sock.connect(str(paths.socket))
        except (FileNotFoundError, ConnectionRefusedError):
            raise StandbyUnusable("no standby ready (none was prepared, or it is still importing or waiting "
                                  "for the start before it to be ready)") from None
        pid, uid = peer_credentials(sock)
        if uid != os.getuid():
            raise StandbyUnusable(f"the standby at {paths.socket} (pid {pid}) runs as uid {uid}, not {os.getuid()}")
        sock.settimeout(reply_timeout_s)
        send(sock, Hello())
        ready, _ = receive(sock, Ready)
        assert isinstance(ready, Ready)
        diffs = engine.fingerprint().diff(Fingerprint.from_wire(ready.fingerprint))
        return sock, ready, [str(d) for d in diffs]


SETTLE_S = 10.0  # how long the preload waits for the standby it spawned to hold its lock (``prepare``)


@contextlib.contextmanager
def _claimed(engine: EngineSpec, directory: Path, place: int = 0) -> Generator[None, None, None]:
    """This launcher is the one taking the standby in ``place`` (and waiting for it, while it imports): a start
    that comes beside it (``hotweights switch`` starting several engines at once) takes another place, or is a
    plain start at once, rather than one that waits up to ``busy.IMPORT_WAIT_S`` for a standby another start takes (on
    an H200, the third of three 8B starts begun together waited the whole 60 s, then imported vLLM itself)."""
    _trusted(directory)
    claim = standby_paths(directory, engine.name, place=place).claim
    try:
        fd = take_pid_lock(claim)
    except BlockingIOError:
        raise StandbyUnusable(f"another start (pid {lock_holder(claim)}) is taking the standby") from None
    try:
        yield
    finally:
        os.close(fd)


def imports_at_once(environ: dict[str, str]) -> bool:
    """Whether the standby a start prepares imports its engine at once, beside that start (``IMPORT_ENV=now``:
    ``hotweights switch``, whose starts follow one another), rather than once the start is ready."""
    return environ.get(IMPORT_ENV, "") == "now"


def hand_over(engine: EngineSpec, directory: Path, module: str, args: list[str], env: dict[str, str], *,
              connect_timeout_s: float = 1.0, reply_timeout_s: float = 10.0, retire_stale: bool = True) -> Server:
    """Give the start (``python -m MODULE ARGS`` with ``env``, this cwd and stdio) to a standby of this
    engine and interpreter (``places``: a ready one first, then one importing); StandbyUnusable says why not
    (the first place's reason). Nothing has started when it raises. A standby whose fingerprint differs is
    retired, unless ``retire_stale`` is False (a caller that is not a start, whose environment may differ from
    the starts' for which the standby is right: the preload's loader)."""
    reasons: list[StandbyUnusable] = []
    for place in _places_in_order(engine, directory, places(env)):
        try:
            with _claimed(engine, directory, place):
                return _hand_over(engine, directory, module, args, env, connect_timeout_s, reply_timeout_s, place,
                                  retire_stale)
        except StandbyUnusable as exc:
            reasons.append(exc)
    raise reasons[0]


def _places_in_order(engine: EngineSpec, directory: Path, count: int) -> list[int]:
    """The places to try, those whose standby is ready (its socket there) first, then those importing (their lock
    held), then the rest: each in place order."""
    def rank(place: int) -> int:
        paths = standby_paths(directory, engine.name, place=place)
        return 0 if paths.socket.exists() else 1 if is_locked(paths.lock) else 2

    return sorted(range(count), key=lambda place: (rank(place), place))


def _hand_over(engine: EngineSpec, directory: Path, module: str, args: list[str], env: dict[str, str],
               connect_timeout_s: float, reply_timeout_s: float, place: int, retire_stale: bool) -> Server:
    sock, ready, changed = _hello(engine, directory, connect_timeout_s, reply_timeout_s, place)
    with _unusable_on_failure(sock, "standby failed the hand-off"):
        unsafe = ("CUDA is initialized in it" if ready.cuda_initialized else
                  f"it runs {ready.threads} Python threads" if ready.threads != 1 else "")
        if changed and not retire_stale and not unsafe:
            raise StandbyUnusable(f"a standby for another environment ({'; '.join(changed[:4])}); left in place")
        if changed or unsafe:
            send(sock, Stop())  # retire it, and wait until it has let go of its lock: the launcher prepares one
            with contextlib.suppress(OSError):
                while sock.recv(4096):
                    pass
            raise StandbyUnusable(f"stale standby ({'; '.join(changed[:4])})" if changed else
                                  f"unsafe standby ({unsafe})")
        stdio = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
        try:
            send(sock, Start(module, args, env, os.getcwd()), stdio)
        finally:
            close_fds([fd for fd in stdio if fd > 2])
        started, _ = receive(sock, Started)
        assert isinstance(started, Started)
        return Server(sock, started.pid, ready.imports_s)


@contextlib.contextmanager
def _unusable_on_failure(sock: Any, what: str) -> Generator[None, None, None]:
    """Close ``sock`` on any failure inside; a transport or protocol failure becomes StandbyUnusable(what)."""
    try:
        yield
    except StandbyUnusable:
        sock.close()
        raise
    except (OSError, EOFError, ProtocolError) as exc:
        sock.close()
        raise StandbyUnusable(f"{what}: {exc}") from None


class Prepared(enum.StrEnum):
    """What ``prepare`` did."""

    PREPARED = "prepared"  # a standby was started
    READY = "ready"  # one holds the lock already (ready, importing or waiting)
    FAILED = "failed"  # the one started did not take its place within ``settle_s`` (logged)
    OFF = "off"  # standbys are turned off (``enabled``)


def enabled(environ: dict[str, str]) -> bool:
    """Whether warm standbys are on: ``HOTWEIGHTS_VLLM_STANDBY=off`` (or 0, false) turns them off."""
    return environ.get(DISABLE_ENV, "").lower() not in ("off", "0", "false")


def prepare(engine: EngineSpec, directory: Path, environ: dict[str, str], *,
            after: tuple[int, str] | None = None, python: str | None = None, settle_s: float = 0.0) -> Prepared:
    """Start a standby for the next start, detached (engines may end their own process tree on exit),
    unless one holds the lock already (``Prepared`` says which). ``python``: the interpreter it is for (this one
    by default; a standby serves starts of its own interpreter only).

    ``after``: the start in progress (its pid, its health URL). The standby imports only once that start
    is ready (or gone), so that the two do not compete for the CPU. It is not niced for that: a server
    forked from it would inherit the priority, which an unprivileged process cannot raise again.

    ``settle_s``: wait up to this long for it to hold its lock, and return ``FAILED`` (logged) if it does not. A
    caller whose next start may follow at once (the preload) needs it: until then that start would not know to
    wait for the standby and would import the engine again beside it (measured on an H200: the start a moment
    after ``preload --engine vllm`` found nothing and took 44.8 s). A start's own ``prepare`` does not wait: it
    would delay that start. ``python`` may be a bare name (``HOTWEIGHTS_VLLM_PYTHON=python3``): it is looked up
    in ``environ``'s PATH, and FileNotFoundError says so when there is none.
    """
    python = shutil.which(python, path=environ.get("PATH", os.defpath)) if python else sys.executable
    if python is None:
        raise FileNotFoundError("the Python for the standby is not on PATH")
    count = places(environ)
    every = [standby_paths(directory, engine.name, python, environ.get("CUDA_VISIBLE_DEVICES", ""), place)
             for place in range(count)]
    held = sum(is_locked(paths.lock) for paths in every)
    if held == count:
        return Prepared.READY  # each place holds one alive (or importing, or waiting)
    free = next(paths for paths in every if not is_locked(paths.lock))
    cmd = [python, "-m", "hotweights.standby.zygote", "--engine", engine.name, "--socket-dir", str(directory),
           "--places", str(count)]  # it takes the first free place: starts that end together prepare one each
    if after is not None:
        cmd += ["--after-pid", str(after[0]), "--after-url", after[1]]
    spawn_detached(cmd, environ, free.log)
    deadline = time.monotonic() + settle_s
    while settle_s and sum(is_locked(paths.lock) for paths in every) <= held:
        if time.monotonic() > deadline:
            logger.warning("the warm standby did not take its place within %.0f s; see %s", settle_s, free.log)
            return Prepared.FAILED
        time.sleep(0.02)
    return Prepared.PREPARED


def holders(engine: EngineSpec, directory: Path) -> list[int]:
    """The pids of every standby of this engine in ``directory``, for any interpreter and devices, in every place,
    those still importing too (each writes its pid into its lock file; one that has handed its server over has let
    its lock go, so a running engine is never among them)."""
    try:
        check_socket_dir(directory)
    except (OSError, TrustError):
        return []
    return sorted({pid for lock in directory.glob(f"{engine.name}-standby-*.lock") if (pid := lock_holder(lock))})


def stop(engine: EngineSpec, directory: Path, wait_s: float = 15.0) -> list[int]:
    """Retire every standby of this engine in ``directory`` (``holders``: of any interpreter and devices, also those
    still importing), and return once they are gone: SIGTERM, SIGKILL to those left after ``wait_s``. Their pids."""
    stopped = holders(engine, directory)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)

    def alive(pid: int) -> bool:  # a zombie no parent reaps (a container's init may not) is gone
        stat = proc_stat(pid)
        return pid_alive(pid) and (stat is None or stat[0] not in ("Z", "X"))

    deadline = time.monotonic() + wait_s
    while (left := [pid for pid in stopped if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def others(engine: EngineSpec, directory: Path) -> list[dict[str, Any]]:
    """The standbys of this engine and interpreter in places other than the first, as their locks say (no hello:
    nothing waits): place, pid, and what each does (waiting, importing, ready)."""
    found = []
    for place in range(1, MAX_PLACES):
        lock = standby_paths(directory, engine.name, place=place).lock
        pid = lock_holder(lock)
        if pid:
            found.append({"place": place, "pid": pid, "doing": " ".join(lock_note(lock)) or "starting"})
    return found


def status(engine: EngineSpec, directory: Path, *, timeout_s: float = 2.0, place: int = 0) -> dict[str, Any]:
    """What the standby of this engine and interpreter in ``place`` says of itself, and whether it fits this
    environment."""
    paths = standby_paths(directory, engine.name, place=place)
    out: dict[str, Any] = {"place": place, "socket": str(paths.socket), "log": str(paths.log), "ready": False}
    try:
        sock, ready, changed = _hello(engine, directory, timeout_s, timeout_s, place)
    except StandbyUnusable as exc:
        out["reason"] = str(exc)
        return out
    sock.close()
    out.update(ready=True, pid=ready.pid, imports_s=ready.imports_s, fits=not changed, differs=changed,
               cuda_initialized=ready.cuda_initialized, threads=ready.threads)
    return out
