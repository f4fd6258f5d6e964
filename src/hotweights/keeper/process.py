"""The daemon as a process: detached from its caller, room for fds, a heap that gives memory back."""

from __future__ import annotations

import contextlib
import ctypes
import resource
from pathlib import Path

from ..paths import rotate_log
from ..unix import detach as unix_detach


def detach(log: Path) -> bool:
    """``unix.detach`` for the daemon (an engine that kills its process tree on exit, as vLLM does, leaves
    it running), its log rotated first: True in the caller, False in the daemon."""
    rotate_log(log)
    return unix_detach(log)


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
