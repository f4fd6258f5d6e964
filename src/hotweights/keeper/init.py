"""``hotweights daemon --init``: a container's PID 1 that outlives a keeper upgrade.

In a pod the keeper is the container's main process: ``daemon --replace`` hands every entry to a new
daemon and ends the old one, and with it the container and the cache. Under ``--init`` the keeper runs as
this process's child instead. ``kubectl exec POD -- hotweights daemon --replace --detach`` starts the new
keeper (a process of the same image: the upgrade is the image's next version once it is rolled out, or a
wheel installed into the running container); it takes the entries and the lock, the old keeper exits, and
this process stays as long as some daemon of its directory holds the lock. It reaps every orphan (a
detached daemon becomes its child: PID 1 of the container, else a child subreaper), passes SIGTERM, SIGINT
and SIGHUP on to the daemon holding the lock, and exits with the last daemon's exit code once none holds it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType

from ..unix import lock_holder

logger = logging.getLogger("hotweights.daemon")

HANDOFF_GRACE_S = 15.0  # between the old keeper's exit and the new one taking the lock
PR_SET_CHILD_SUBREAPER = 36


def run_init(argv: list[str], lock: Path) -> int:
    """Run ``argv`` (the daemon) and stay while a daemon holds ``lock``; the last daemon's exit code."""
    if os.getpid() != 1:  # orphans go to the nearest subreaper: this process, as they would to a PID 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    child = subprocess.Popen(argv)
    code = 0
    stopping = [False]

    def forward(sig: int, _frame: FrameType | None) -> None:
        stopping[0] = stopping[0] or sig != signal.SIGHUP  # no hand-off to wait for once asked to stop
        target = lock_holder(lock) or (child.pid if child.poll() is None else 0)
        if target:
            os.kill(target, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    logger.info("init: keeper pid %d started; this process stays while a keeper holds %s", child.pid, lock)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid, status = 0, 0
        if pid:
            code = os.waitstatus_to_exitcode(status)
            logger.info("init: pid %d exited (code %d)", pid, code)
            continue
        if lock_holder(lock) is None and not _taken_within(lock, 0.0 if stopping[0] else HANDOFF_GRACE_S):
            logger.info("init: no keeper holds %s any more; exiting (code %d)", lock, code)
            return code
        time.sleep(0.2)


def _taken_within(lock: Path, seconds: float) -> bool:
    """Whether some daemon takes ``lock`` within ``seconds`` (a hand-off in progress), reaping meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lock_holder(lock) is not None:
            return True
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False
