"""The daemon as a process: detached from its caller, room for fds, a heap that gives memory back."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys
from pathlib import Path

from ..paths import rotate_log


def detach(log: Path) -> bool:
    """Double-fork into the background: the daemon is then no descendant of the caller, so an engine that
    kills its process tree on exit (vLLM does) leaves it running. True in the caller, False in the daemon,
    whose stdin is /dev/null and whose output goes to ``log``: a caller read through a pipe or ``$(...)``
    is not held open by it."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() > 0:
        return True
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    rotate_log(log)
    null, out = os.open(os.devnull, os.O_RDONLY), os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd, target in ((null, 0), (out, 1), (out, 2)):
        os.dup2(fd, target)
    os.close(null)
    os.close(out)
    return False


def tune_process() -> None:
    """Room for fds, and a heap that gives memory back: thread-per-connection under glibc
    otherwise grows one malloc arena per thread, each keeping its freed memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX = 2


def trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
