"""What a dead front left running. Engines die with their front (``unix.die_with_parent``), but not always: an engine
that hangs (stopped, stuck in a driver call) does not act on the signal, and engines started by a front older than
that fix do not get it at all; each keeps its port and its memory, on a GPU its GPU memory. So while a front runs it
keeps a note of its engines in the keeper's directory (``switch/<front pid>.json``: each engine's process and its
start time, so that a pid used again by another process is never taken for it), and a front that starts retires
what a dead one's note names, in one line, before it starts its own. Torch-free."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ...paths import ensure_socket_dir
from ...unix import proc_stat, signal_group, stop_group

logger = logging.getLogger("hotweights.switch")
RETIRE_GRACE_S = 10.0


def started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``), None where there is none (or it
    is a zombie: it runs no more)."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def notes_dir(daemon_dir: Path) -> Path:
    return daemon_dir / "switch"


class Note:
    """This front's note of its engines: ``{model: [pid, started_at], ...}``, written again when a pid changes."""

    def __init__(self, daemon_dir: Path, url: str = "") -> None:
        ensure_socket_dir(daemon_dir)  # private, ours: as the keeper's own
        directory = notes_dir(daemon_dir)
        directory.mkdir(mode=0o700, exist_ok=True)
        self.path = directory / f"{os.getpid()}.json"
        self.front = [os.getpid(), started_at(os.getpid())]
        self.url = url  # where it serves: `hotweights switch status` without flags finds it here
        self.written: dict[str, list[int | None]] | None = None

    async def kept(self, pids: Callable[[], dict[str, list[int]]], interval_s: float = 1.0) -> None:
        """Until cancelled: ``keep(pids())`` every ``interval_s``."""
        while True:
            self.keep(pids())
            await asyncio.sleep(interval_s)

    def keep(self, pids: dict[str, list[int]]) -> None:
        """``pids``: each model's engine processes (its launcher, and a standby's child that serves)."""
        engines = {f"{name} {pid}": [pid, started_at(pid)] for name, ps in pids.items() for pid in set(ps) if pid}
        if engines == self.written:
            return
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps({"front": self.front, "url": self.url, "engines": engines}))
        os.replace(part, self.path)
        self.written = engines

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def running_fronts(daemon_dir: Path) -> list[str]:
    """The URLs of the fronts that run over this keeper's directory, from their notes (a front that is gone, or a
    note that cannot be read, is left out)."""
    urls = []
    directory = notes_dir(daemon_dir)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            note = json.loads(path.read_text())
            (front, front_started), url = note["front"], note.get("url")
            if url and started_at(front) == front_started:
                urls.append(str(url))
    return urls


def retire_left(daemon_dir: Path) -> list[str]:
    """Stop the engines that dead fronts' notes name and that still run; ``model (pid N)`` of each, said in one line
    per dead front. A note that cannot be read is left alone (and said)."""
    retired: list[str] = []
    directory = notes_dir(daemon_dir)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            note = json.loads(path.read_text())
            (front, front_started), engines = note["front"], note["engines"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("switch: %s cannot be read (%s): left alone", path, exc)
            continue
        if started_at(front) == front_started:
            continue  # that front runs: its engines are its own
        left = [(key.rsplit(" ", 1)[0], pid) for key, (pid, began) in engines.items()
                if began is not None and started_at(pid) == began]
        end([pid for _, pid in left])
        if left:
            said = [f"{name} (pid {pid})" for name, pid in left]
            logger.warning("switch: retired %d engine(s) that a dead front (pid %d) left running: %s", len(left),
                           front, ", ".join(said))
            retired += said
        path.unlink(missing_ok=True)
    return retired


def end(pids: list[int]) -> None:
    """SIGTERM (and SIGCONT: a stopped process acts on it now) to each process's group, or to the process alone where
    it leads none (a standby's child); SIGKILL to what is left after ``RETIRE_GRACE_S``."""
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            if not signal_group(pid, sig):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
    for pid in pids:
        stop_group(pid, RETIRE_GRACE_S)
        deadline = time.monotonic() + RETIRE_GRACE_S
        while started_at(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            if started_at(pid) is not None:
                os.kill(pid, signal.SIGKILL)
