"""The launcher's side of ``--park-on-exit`` (``parked.py``): start the server or take over a parked one, stay in
front of it, park it on Ctrl-C. Torch-free."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..standby.fingerprint import Fingerprint
from ..observe import post
from .records import Record, alive, parked_dir, read_record, stop, take_over
from .watch import parked_keys

logger = logging.getLogger("hotweights.parked.records")


class Front:
    """The launcher in front of a server it started or woke: copies the server's log to this process's
    output, and on SIGINT/SIGTERM/SIGHUP parks it (or stops it when the park fails)."""

    def __init__(self, directory: Path, pid: int, url: str, engine: str, start: Fingerprint, level: int,
                 log: Path, child: subprocess.Popen[bytes] | None = None, log_from: int = 0,
                 idle_s: float = 3600.0) -> None:
        self.directory, self.pid, self.url, self.engine, self.start = directory, pid, url, engine, start
        self.level, self.log, self.child, self.offset, self.idle_s = level, log, child, log_from, idle_s
        self._signal = 0

    @property
    def path(self) -> Path:
        return self.directory / f"{self.pid}.json"

    def _record(self, level: int, keys: tuple[str, ...] = ()) -> None:
        """Write this server's record (awake: this launcher in front; parked: ``level``), and make sure one
        watcher follows it."""
        old = read_record(self.path) if self.path.exists() else None
        watcher = old.watcher if old is not None and alive(old.watcher) else 0
        record = Record(self.pid, self.url, self.engine, self.start.to_wire(), level, str(self.log),
                        time.time() if level else 0.0, self.idle_s, keys, 0 if level else os.getpid(), watcher)
        if not watcher:
            watcher = subprocess.Popen([sys.executable, "-m", "hotweights.parked.watch", str(self.path)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True).pid
            record = dataclasses.replace(record, watcher=watcher)
        self.path.with_suffix(".tmp").write_text(json.dumps(asdict(record)))
        self.path.with_suffix(".tmp").replace(self.path)

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self._record(0)
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            while True:
                self._copy(f)
                code = self._exit_code()
                if code is not None:
                    self._copy(f)
                    self.path.unlink(missing_ok=True)
                    return code
                if self._signal:
                    return self._park(f)
                time.sleep(0.1)

    def _on_signal(self, sig: int, _frame: Any) -> None:
        self._signal = sig

    def _copy(self, f: Any) -> None:
        chunk = f.read()
        if chunk:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()

    def _exit_code(self) -> int | None:
        if self.child is not None:
            return self.child.poll()
        return None if alive(self.pid) else 1

    def _park(self, f: Any) -> int:
        try:
            post(f"{self.url}/sleep?level={self.level}", 120)
        except OSError as exc:
            logger.info("could not park the engine (%s); stopping it", exc)
            stop(self.pid)
            self._copy(f)
            self.path.unlink(missing_ok=True)
            return self._exit_code() or 0
        self._copy(f)
        self._record(self.level, tuple(parked_keys(self.directory.parent, self.pid)))
        logger.info("Parked the engine at %s (pid %d, level %d): the same start wakes it (`hotweights parked` "
                    "lists it, `hotweights parked --retire %d` stops it)", self.url, self.pid, self.level, self.pid)
        return 0


def run_front(daemon_dir: Path, engine: str, start: Fingerprint, url: str, cmd: list[str], env: dict[str, str],
              level: int, idle_s: float) -> int:
    """``--park-on-exit``: wake the parked engine of this start at ``url``, else start ``cmd``; stay in front."""
    directory = parked_dir(daemon_dir)
    record = take_over(directory, start, url)
    if record is not None:
        log = Path(record.log)
        return Front(directory, record.pid, url, engine, start, level, log, log_from=log.stat().st_size,
                     idle_s=idle_s).run()
    log = directory / f"{engine}-{time.time_ns()}.log"
    child = launch(cmd, env, log)
    try:
        return Front(directory, child.pid, url, engine, start, level, log, child=child, idle_s=idle_s).run()
    finally:
        if child.poll() is not None:  # stopped, not parked: its output was copied; nothing is left of it
            log.unlink(missing_ok=True)


def launch(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The server, in its own session (the terminal's Ctrl-C reaches only the launcher), writing to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
