"""The launcher's side of a warm standby: find one that fits this start, hand the start over, stay in front.

Runs in the hotweights CLI process (``hotweights vllm serve ...``), before vLLM is imported, and
imports nothing of vLLM or torch. The standby (``standby.py``) is a process of the same Python
with vLLM already imported; it answers on ``<socket dir>/vllm-standby-<tag>.sock``, one per
interpreter (``tag``: a digest of its path). The socket directory is the daemon's: the same trust
rules hold (a private directory of this user; the peer's uid is checked both ways).

A standby is used only when its ``fingerprint`` equals this launcher's: the same interpreter
(path and version), the same installed vLLM, torch and hotweights (versions and file mtimes),
and the same environment variables that change what vLLM imports or how (``ENV_PREFIXES``).
Otherwise, or when none answers in time, the start is a plain one and says why in one line.
A standby that crashed, hung or was killed costs at most that plain start.

Wire: ``wire`` frames of msgpack maps. launcher -> ``hello``; standby -> ``ready`` (pid, fingerprint,
imports_s, cuda_initialized, threads); launcher -> ``start`` (module, args, env, cwd) with fds 0, 1, 2;
standby -> ``started`` (the server's pid, leader of its own process group), later ``exited`` (code).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from ...errors import HotweightsError, ProtocolError, TrustError
from ...paths import check_socket_dir
from ...wire import close_fds, recv_frame, send_frame

logger = logging.getLogger(__name__)

# environment variables that change what vLLM (or what it imports) does at import or start
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_", "PYTHON", "LD_", "HF_", "TRANSFORMERS_",
                "TOKENIZERS_", "OMP_", "MKL_", "TRITON_", "HOTWEIGHTS_")
PACKAGES = ("vllm", "torch", "transformers", "hotweights")
DISABLE_ENV = "HOTWEIGHTS_VLLM_STANDBY"  # "off": never use or prepare a standby


class StandbyUnusable(HotweightsError):
    """No standby can take this start; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class StandbyPaths:
    socket: Path
    lock: Path
    log: Path


def standby_paths(directory: Path, python: str | None = None) -> StandbyPaths:
    tag = hashlib.blake2b(os.path.realpath(python or sys.executable).encode(), digest_size=4).hexdigest()
    return StandbyPaths(*(directory / f"vllm-standby-{tag}.{ext}" for ext in ("sock", "lock", "log")))


def fingerprint(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What a standby must share with a start to take it: interpreter, packages, environment."""
    env = os.environ if environ is None else environ
    stamp = {"python": f"{os.path.realpath(sys.executable)} {sys.version.split()[0]}"}
    for name in PACKAGES:
        stamp[f"package {name}"] = _package_stamp(name)
    for key in sorted(env):
        if key.startswith(ENV_PREFIXES) and key != DISABLE_ENV:
            stamp[f"env {key}"] = env[key]
    return stamp


def _package_stamp(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    # a reinstall rewrites the package's files; hotweights (small, often an editable checkout): every file
    files = root.rglob("*.py") if name == "hotweights" else (root / "__init__.py", root)
    newest = max((p.stat().st_mtime_ns for p in files if p.exists()), default=0)
    return f"{version} {root} {newest}"


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def send(sock: socket.socket, op: str, fds: list[int] | tuple[int, ...] = (), **fields: Any) -> None:
    send_frame(sock, msgpack.packb({"op": op, **fields}), fds)


def receive(sock: socket.socket, *expected: str) -> tuple[dict[str, Any], list[int]]:
    """The next message, which must be one of ``expected``; EOFError when the peer is gone."""
    payload, fds = recv_frame(sock)
    try:
        msg = msgpack.unpackb(payload, raw=False, max_str_len=1 << 20, max_array_len=1 << 16, max_map_len=1 << 16)
    except (ValueError, msgpack.UnpackException) as exc:
        close_fds(fds)
        raise ProtocolError(f"standby frame is not msgpack: {exc}") from None
    if not isinstance(msg, dict) or msg.get("op") not in expected:
        close_fds(fds)
        raise ProtocolError(f"standby sent {str(msg)[:80]}; expected {' or '.join(expected)}")
    return msg, fds


def peer_uid(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


@dataclass(slots=True)
class Server:
    """A vLLM server a standby started for this launcher."""

    conn: socket.socket
    pid: int
    imports_s: float

    def wait(self) -> int:
        """Relay SIGINT, SIGTERM and SIGHUP to the server's process group until it exits; its exit code."""

        def relay(signum: int, _frame: object) -> None:
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, relay)
        self.conn.settimeout(None)
        try:
            msg, _ = receive(self.conn, "exited")
            return int(msg.get("code", 1))
        except (EOFError, OSError, ProtocolError) as exc:
            # the standby died: the server got SIGTERM with it (PR_SET_PDEATHSIG); wait until it is gone
            logger.error("the vLLM standby supervising pid %d went away (%s); waiting for the server to end",
                         self.pid, exc)
            while Path(f"/proc/{self.pid}").exists():
                time.sleep(0.2)
            return 1
        finally:
            self.conn.close()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _hello(directory: Path, connect_timeout_s: float, reply_timeout_s: float) -> tuple[socket.socket, dict, list[str]]:
    """A trusted connection to the standby of this interpreter, its ``ready`` and what differs from this
    launcher's fingerprint; StandbyUnusable says why there is none."""
    paths = standby_paths(directory)
    try:
        check_socket_dir(directory)
    except FileNotFoundError:
        raise StandbyUnusable(f"no standby prepared yet (no {directory})") from None
    except TrustError as exc:
        raise StandbyUnusable(f"untrusted socket dir: {exc}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(connect_timeout_s)
    try:
        try:
            sock.connect(str(paths.socket))
        except (FileNotFoundError, ConnectionRefusedError):
            raise StandbyUnusable("no standby ready (none was prepared, or it is still importing vLLM or "
                                      "waiting for the start before it to be ready)") from None
        pid, uid = peer_uid(sock)
        if uid != os.getuid():
            raise StandbyUnusable(f"the standby at {paths.socket} (pid {pid}) runs as uid {uid}, not {os.getuid()}")
        sock.settimeout(reply_timeout_s)
        send(sock, "hello")
        ready, _ = receive(sock, "ready")
        return sock, ready, differences(fingerprint(), ready.get("fingerprint") or {})
    except StandbyUnusable:
        sock.close()
        raise
    except (OSError, EOFError, ProtocolError) as exc:
        sock.close()
        raise StandbyUnusable(f"standby unreachable: {exc}") from None


def hand_over(directory: Path, module: str, args: list[str], env: dict[str, str], *,
              connect_timeout_s: float = 1.0, reply_timeout_s: float = 10.0) -> Server:
    """Give the start (``python -m MODULE ARGS`` with ``env``, this cwd and stdio) to the standby of this
    interpreter; StandbyUnusable says why not. Nothing has started when it raises."""
    sock, ready, changed = _hello(directory, connect_timeout_s, reply_timeout_s)
    try:
        unsafe = ("CUDA is initialized in it" if ready.get("cuda_initialized") else
                  f"it runs {ready.get('threads')} Python threads" if ready.get("threads") != 1 else "")
        if changed or unsafe:
            send(sock, "stop")  # retire it, and wait until it has let go of its lock: the launcher prepares one
            with contextlib.suppress(OSError):
                while sock.recv(4096):
                    pass
            raise StandbyUnusable(f"stale standby ({', '.join(changed[:4])} differ{'s' if len(changed) == 1 else ''})"
                                  if changed else f"unsafe standby ({unsafe})")
        stdio = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
        try:
            send(sock, "start", stdio, module=module, args=args, env=env, cwd=os.getcwd())
        finally:
            close_fds([fd for fd in stdio if fd > 2])
        started, _ = receive(sock, "started")
        return Server(sock, int(started["pid"]), float(ready.get("imports_s", 0.0)))
    except StandbyUnusable:
        sock.close()
        raise
    except (OSError, EOFError, ProtocolError, KeyError, ValueError, TypeError) as exc:
        sock.close()
        raise StandbyUnusable(f"standby failed the hand-off: {exc}") from None


def prepare(directory: Path, environ: dict[str, str], *, after: tuple[int, str] | None = None) -> bool:
    """Start a standby for the next start, detached (vLLM ends its own process tree on exit), unless one
    holds the lock already. True if one was started.

    ``after``: the start in progress (its pid, its health URL). The standby imports vLLM only once that
    start is ready (or gone), so that the two do not compete for the CPU. It is not niced for that: a
    server forked from it would inherit the priority, which an unprivileged process cannot raise again.
    """
    paths = standby_paths(directory)
    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # one is alive (or importing)
    finally:
        os.close(fd)  # the lock goes with it: the standby takes it itself
    cmd = [sys.executable, "-m", "hotweights.engines.vllm.standby", "--socket-dir", str(directory)]
    if after is not None:
        cmd += ["--after-pid", str(after[0]), "--after-url", after[1]]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # double fork: the standby is nobody's child, in a session of its own
        try:
            os.setsid()
            if os.fork() == 0:
                log = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.execve(cmd[0], cmd, environ)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return True


def stop(directory: Path) -> int | None:
    """Retire the standby of this interpreter, also one still importing (SIGTERM to the lock holder's pid,
    which it writes into the lock file); its pid, or None if there is none."""
    paths = standby_paths(directory)
    try:
        check_socket_dir(directory)
        fd = os.open(paths.lock, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, TrustError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it
    except BlockingIOError:
        pid = int(os.read(fd, 32) or b"0")
    finally:
        os.close(fd)
    if pid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    return pid or None


def status(directory: Path, *, timeout_s: float = 2.0) -> dict[str, Any]:
    """What the standby of this interpreter says of itself, and whether it fits this environment."""
    paths = standby_paths(directory)
    out: dict[str, Any] = {"socket": str(paths.socket), "log": str(paths.log), "ready": False}
    try:
        sock, ready, changed = _hello(directory, timeout_s, timeout_s)
    except StandbyUnusable as exc:
        out["reason"] = str(exc)
        return out
    sock.close()
    out.update(ready=True, pid=ready.get("pid"), imports_s=ready.get("imports_s"), fits=not changed,
               differs=changed, cuda_initialized=ready.get("cuda_initialized"), threads=ready.get("threads"))
    return out
