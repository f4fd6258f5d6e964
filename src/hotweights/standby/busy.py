"""A start's wait for a standby that holds its place but does not answer yet (the launcher's side, ``handoff``).

The standby (``zygote``) takes its place's lock, then says what it does in the lock's note (``unix.write_lock_note``):
``waiting PID URL`` (for the start in progress PID to be ready, URL its ``/health``), ``importing``, ``ready``. A start
waits for one importing, whose imports end sooner than a plain start's would, and not for one still waiting for a
start in progress. Torch-free.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..observe import healthy
from ..unix import lock_holder, lock_note, pid_alive

logger = logging.getLogger("hotweights.standby.handoff")  # the launcher's lines, as a user greps for them

IMPORT_WAIT_S = 60.0  # a standby importing its engine is ready sooner than a plain start imports it again
# whether the start a standby waits for is ready: one that is not answers 503 or refuses at once, so only a loaded
# machine answers late, and a late answer taken for "not ready" costs a plain start (CI, 2 CPUs, 1 s: a start
# found no standby a moment after the one before was ready)
HEALTH_ASK_S = 5.0


def wait_while_importing(lock: Path, sock: Path, timeout_s: float = IMPORT_WAIT_S) -> None:
    """When a standby holds its lock but does not answer yet because it is importing (the start it followed,
    if any, is ready or gone: a preload's standby, or one prepared by the previous start, which may still
    serve), wait for it: a plain start would import the same modules again, beside it. One that waits for a
    start still in progress is not waited for: it imports only once that start is ready.

    A start that follows a ready one at once (``hotweights switch`` starting its engines in turn) found none:
    on an H200 the second of three 8B engines then started plainly (80.9 s, against ~20 s from a standby)."""
    pid = lock_holder(lock) if not sock.exists() else 0
    if not pid:
        return
    note = first_note(lock, pid)  # what the standby says it does: waiting PID URL, importing, ready
    if note[:1] == ["waiting"] and len(note) == 3 and note[1].isdigit() and pid_alive(int(note[1])) \
            and not (note[2] != "-" and healthy(note[2], HEALTH_ASK_S)):
        return
    import socket

    logger.info("Waiting for the warm standby (pid %d), which is importing its engine", pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
            if probe.connect_ex(str(sock)) == 0:  # listening: it has imported (a connection it just drops)
                return
        time.sleep(0.1)


NOTE_WAIT_S = 2.0  # a standby says what it does right after it takes its lock (``zygote``)


def first_note(lock: Path, pid: int, timeout_s: float = NOTE_WAIT_S) -> list[str]:
    """The note of ``lock``'s holder ``pid``, waiting up to ``timeout_s`` for its first one: a standby takes its
    lock, then writes what it does. Read in between, the note was empty, and a start took a standby waiting for
    the start before it for one importing, and waited the whole ``IMPORT_WAIT_S`` (CI, 2026-12-05)."""
    deadline = time.monotonic() + timeout_s
    while not (note := lock_note(lock)) and lock_holder(lock) == pid and time.monotonic() < deadline:
        time.sleep(0.02)
    return note
