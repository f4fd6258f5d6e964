"""Process plumbing that the keeper and the standby share: who is at the other end of a Unix socket, a
process detached from its caller, a pid lock file, a process title.

Linux only (``SO_PEERCRED``, ``flock``). Stdlib only: the keeper imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket: the kernel's word."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def detach(log: Path) -> bool:
    """Double-fork into the background: the child is then no descendant of the caller, in a session of its
    own, so a caller that kills its process tree on exit (vLLM does) leaves it running. True in the caller
    (once the intermediate process is gone: no zombie), False in the child, whose stdin is /dev/null and
    whose output goes to ``log``: a caller read through a pipe or ``$(...)`` is not held open by it."""
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle > 0:
        os.waitpid(middle, 0)
        return True
    try:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        null, out = os.open(os.devnull, os.O_RDONLY), os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for fd, target in ((null, 0), (out, 1), (out, 2)):
            os.dup2(fd, target)
        os.close(null)
        os.close(out)
    except BaseException:
        os._exit(1)
    return False


def spawn_detached(cmd: list[str], env: dict[str, str], log: Path) -> None:
    """Run ``cmd`` with ``env`` as a detached process (``detach``); returns at once in the caller.
    FileNotFoundError, before anything is spawned, when ``cmd[0]`` is not an executable (a bare name is
    looked up in ``env``'s PATH: ``execve`` does not search it)."""
    program = shutil.which(cmd[0], path=env.get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(f"cannot run {cmd[0]!r}: no such executable (PATH={env.get('PATH', os.defpath)})")
    if detach(log):
        return
    try:
        os.execve(program, cmd, env)
    except OSError as exc:
        print(f"cannot run {program}: {exc}", file=sys.stderr, flush=True)  # the log: stderr is it now
    finally:
        os._exit(127)


def take_pid_lock(path: Path, *, wait_s: float = 0.0) -> int:
    """Hold ``path``'s flock (the file created 0600, no symlink followed), waiting up to ``wait_s`` for its
    holder to let go, and write this pid into it; the fd, held as long as the lock. BlockingIOError when
    another process holds it (``lock_holder`` says which)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            os.close(fd)
            raise
    pid = f"{os.getpid()}\n".encode()
    os.pwrite(fd, pid.ljust(os.fstat(fd).st_size, b" "), 0)  # over the last holder's: never read empty
    os.ftruncate(fd, len(pid))
    return fd


def _note_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".note")


def write_lock_note(lock: Path, *fields: str) -> None:
    """What the holder of ``lock`` (``take_pid_lock``) says of itself: ``lock_note`` reads it.

    A file of its own beside the lock, replaced whole (a rename): a reader sees the old note or the new one,
    never a part. Rewritten in place, it was read empty once (CI, 2026-12-04), and a start did not wait for a
    standby that was importing."""
    note = _note_path(lock)
    staged = note.with_name(f"{note.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, " ".join([str(os.getpid()), *fields]).encode() + b"\n")
    finally:
        os.close(fd)
    os.rename(staged, note)


def drop_lock_note(lock: Path) -> None:
    """Remove the note of ``lock``'s holder: called by that holder only, while it holds the lock (so no next holder's
    note is removed)."""
    with contextlib.suppress(FileNotFoundError):
        _note_path(lock).unlink()


def lock_note(path: Path) -> list[str]:
    """The fields the holder of ``path``'s lock wrote (``write_lock_note``); [] when nobody holds it, or its
    holder has written none (a note left by an earlier holder is not its)."""
    holder = lock_holder(path)
    if not holder:
        return []
    try:
        fields = _note_path(path).read_text(errors="replace").split()
    except OSError:
        return []
    return fields[1:] if fields[:1] == [str(holder)] else []


def lock_holder(path: Path) -> int | None:
    """The pid written in ``path`` while a process holds its lock; None when nobody holds it (or no file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        text = (os.pread(fd, 32, 0).decode(errors="replace").split() or [""])[0]
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether a process holds ``path``'s lock (it exists and cannot be taken now)."""
    return lock_holder(path) is not None


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (which may hold spaces): ``[state, ppid, pgrp,
    session, ...]``, the start time (clock ticks since boot) at index 19; None where there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_status(pid: int) -> dict[str, int]:
    """Bytes of VmRSS, RssAnon, RssFile and RssShmem of ``pid`` (``/proc/PID/status``; {} for a process that is
    gone)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def pid_alive(pid: int, *, others: bool = True) -> bool:
    """Whether process ``pid`` exists; ``others``: what to say of another user's process (it exists, but is not
    ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return others
    return True


def signal_group(pgid: int, signum: int) -> bool:
    """``signum`` to the process group ``pgid``; False when it is gone (or not ours to signal)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class _Child(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...


def stop_group(pid: int, grace_s: float = 30.0, *, first: int = signal.SIGTERM, child: _Child | None = None) -> None:
    """Stop a server and all it started: ``first`` to the process group ``pid`` leads (a server started in a
    session of its own), SIGKILL to the group after ``grace_s``. Returns once ``pid`` and its group are gone:
    ``child`` (its ``subprocess.Popen``) is waited for, which reaps it; else ``pid`` is polled (and reaped if ours)."""
    if not signal_group(pid, first):
        if child is not None:
            child.wait()
        return
    if not _ended(pid, grace_s, child):
        signal_group(pid, signal.SIGKILL)
        _ended(pid, 30.0, child)


def _ended(pid: int, timeout_s: float, child: _Child | None) -> bool:
    """Whether ``pid`` and each process of its group ended within ``timeout_s`` (children may outlive a leader)."""
    deadline = time.monotonic() + timeout_s
    if child is not None:
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
    while pid_alive(pid, others=False) or signal_group(pid, 0):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


DIE_WITH_ENV = "HOTWEIGHTS_DIE_WITH"  # a process that starts us and wants us gone with it: its pid


def die_with_parent() -> None:
    """Where ``$HOTWEIGHTS_DIE_WITH`` names our parent (``hotweights switch`` starts its engines so), SIGTERM us when
    it dies, however it dies (``PR_SET_PDEATHSIG``; a kill -9 of the front or a closed terminal left every engine
    running, holding its port and GPU memory). Taken out of the environment: our own children die with us by our own
    means. Linux only; elsewhere nothing."""
    wanted = os.environ.pop(DIE_WITH_ENV, "")
    if not wanted or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if str(os.getppid()) != wanted:  # it died before the line above: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def set_process_title(title: str) -> None:
    """The process title (``ps``, ``/proc/PID/cmdline``) through setproctitle where installed (vLLM depends on
    it), else only the short name (``PR_SET_NAME``)."""
    import importlib

    try:
        importlib.import_module("setproctitle").setproctitle(title)
    except ImportError:
        ctypes.CDLL(None).prctl(15, title.rsplit("/", 1)[-1].encode()[:15], 0, 0, 0)  # PR_SET_NAME


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (``/proc/PID/task/*/children``: a child forked by any of its
    threads); [] for a process that is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids + [g for k in kids for g in descendants(k)]
