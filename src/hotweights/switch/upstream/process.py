"""One engine's server process behind the switch: started on a loopback port of its own in a session of its own,
its output appended to its log; asked over HTTP (``/health``, ``/sleep``, ``/wake_up``); stopped with all it
started. Blocking calls (the switch runs them on worker threads). Torch-free.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

from ... import evidence
from ...observe import free_port, healthy, post
from ...standby.handoff import serving_pids
from ...unix import pid_alive, stop_group

REASON_CHARS = 300
PORT_TRIES = 3  # picks of a free port for one start: another process may bind the one picked before the engine does
PORT_TAKEN = "Address already in use"  # what the engine's output says then (errno 98, as Python and vLLM print it)
logger = logging.getLogger("hotweights.switch")
_CLI_ERROR_RE = re.compile(r"^hotweights [\w-]+: (.+)$")  # the CLI's one line (cli.main)
_EXCEPTION_RE = re.compile(r"\b((?:[A-Z]\w*)?(?:Error|Exception): .+)$")


class EngineError(RuntimeError):
    """An engine that would not start, park or wake; the message says why, in one line."""


class WakeRefused(EngineError):
    """A wake the engine refused for memory (it stays parked): parking another engine may make room."""


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line, cut at a word (``...``) when longer than ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit].rsplit(" ", 1)[0] + " ..."


def reason_in(log: str) -> str:
    """Why a server stopped, from its output: the CLI's one-line error, else the last exception's line, else the
    last line."""
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    said = [i for i, x in enumerate(lines) if _CLI_ERROR_RE.search(x)]
    if said:  # the CLI's message is its last output, over one line or a few
        return one_line(" ".join([_CLI_ERROR_RE.sub(r"\1", lines[said[-1]]), *lines[said[-1] + 1:]]))
    found = [m.group(1) for x in lines if (m := _EXCEPTION_RE.search(x))]
    return one_line(found[-1] if found else lines[-1] if lines else "no output")


class EngineProcess:
    def __init__(self, name: str, log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.server = 0  # the server a warm standby forked for this start (the standby's child), if any
        self._log_from = 0  # where this start's output begins in the log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def pids(self) -> list[int]:
        """The processes of this start: with vLLM from a warm standby, the server is the standby's child."""
        return serving_pids(self.pid, self.server) if self.pid else []

    def alive(self) -> bool:
        """Its process runs, and so does the server a warm standby forked for it (that server may die first)."""
        return self.proc is not None and self.proc.poll() is None and (not self.server or pid_alive(self.server))

    def start(self, command: Callable[[int], tuple[list[str], dict[str, str]]], timeout_s: float = 900.0) -> float:
        """Start the server ``command(port)`` gives (its argv and environment) on a new port and wait for its
        ``/health``; the seconds it took. EngineError (the server's own reason, one line) when it exits first or
        is not ready in ``timeout_s``. A port another process took between its pick and the server's bind
        (``Address already in use``) costs another pick, up to ``PORT_TRIES`` in all."""
        began = time.monotonic()
        for attempt in range(1, PORT_TRIES + 1):
            try:
                return self._start(command, timeout_s - (time.monotonic() - began))
            except EngineError as exc:
                if attempt == PORT_TRIES or PORT_TAKEN not in self.output():
                    raise
                logger.warning("%s: port %d was taken before its engine bound it (%s); trying another port",
                               self.name, self.port, exc)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start(self, command: Callable[[int], tuple[list[str], dict[str, str]]], timeout_s: float) -> float:
        self.stop()
        self.port = free_port()
        cmd, env = command(self.port)
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._log_from = log.tell()
            self.proc = proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True)
        while time.monotonic() - began < timeout_s:
            if proc.poll() is not None:  # ``stop`` from another thread ends it too
                raise EngineError(f"{self.name}: its engine exited with code {proc.returncode} while starting: "
                                  f"{reason_in(self.output())} (log: {self.log_path})")
            if healthy(f"{self.url}/health"):
                self.server = evidence.standby_server(self.output())  # the launcher names the server it handed to
                return time.monotonic() - began
            time.sleep(0.1)
        self.stop()
        raise EngineError(f"{self.name}: not ready after {timeout_s:.0f} s: {reason_in(self.output())} "
                          f"(log: {self.log_path})")

    def output(self, since: int | None = None) -> str:
        """The log from this start's beginning (or byte ``since``)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_from if since is None else since)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def ask(self, path: str, timeout_s: float, body: dict[str, Any] | None = None) -> None:
        """POST ``path`` (``/sleep?level=N``, ``/wake_up``; ``body`` as JSON); OSError with the answer when refused."""
        post(f"{self.url}{path}", timeout_s=timeout_s, body=body)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``."""
        proc, server, self.proc, self.server = self.proc, self.server, None, 0
        if proc is not None:
            stop_group(proc.pid, grace_s, child=proc)
        if server:  # a standby's child leads a group of its own, which may outlive it (orphans of a dead server)
            stop_group(server, grace_s)
