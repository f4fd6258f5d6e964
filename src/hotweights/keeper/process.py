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


KEEPER_OOM_SCORE_ADJ = -900


def tune_process() -> str:
    """Room for fds, and a heap that gives memory back: thread-per-connection under glibc
    otherwise grows one malloc arena per thread, each keeping its freed memory. Returns a line on
    the OOM score (``spare_from_oom_killer``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX = 2
    return spare_from_oom_killer()


def spare_from_oom_killer() -> str:
    """Ask the kernel to kill anything else first under memory pressure. The keeper's own footprint is
    small (it maps no pool), but its death frees every entry at once and every engine then reads the disk
    again: a loader (which raises its own score, ``headroom.lower_priority_for_the_oom_killer``) or an
    engine loses only itself. Lowering the score needs CAP_SYS_RESOURCE (root, or systemd's
    ``OOMScoreAdjust=``); without it the daemon keeps the score it was given and says so."""
    path = Path("/proc/self/oom_score_adj")
    try:
        path.write_text(str(KEEPER_OOM_SCORE_ADJ))
        return f"oom_score_adj {KEEPER_OOM_SCORE_ADJ} (the kernel's last choice under memory pressure)"
    except OSError as exc:
        current = path.read_text().strip() if path.exists() else "?"
        return (f"oom_score_adj stays {current} ({exc.strerror}: lowering it needs CAP_SYS_RESOURCE, e.g. "
                f"OOMScoreAdjust={KEEPER_OOM_SCORE_ADJ} in a systemd unit)")


def trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
