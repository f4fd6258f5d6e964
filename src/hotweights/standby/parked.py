"""Parked engines: a start asked to park on exit (``--park-on-exit``) leaves its server parked, and the next
run of the same start wakes it and serves on the same address instead of starting again.

Runs in the hotweights CLI process, torch-free. With ``--park-on-exit`` the server runs as a child in its
own session, writing to a log file that the launcher copies to its own output; the launcher stays in
front. Ctrl-C, SIGTERM or SIGHUP to the launcher parks the server (``POST /sleep?level=N``), records it in
``<daemon dir>/parked/<pid>.json`` and returns 0; the server keeps its port and waits (``503
engine_sleeping`` to generations). Without ``--park-on-exit`` nothing of this happens: Ctrl-C stops and
frees everything, as always.

The next launch of a start on that address reads the record:

- the same start (``Fingerprint``: every argument of the start, the interpreter, the engine's packages,
  the environment that changes it): it wakes the parked server (``POST /wake_up``), waits for
  ``/health``, and stays in front of it as if it had started it (``Woke a parked engine ...`` line);
- another start: it retires the parked one first (SIGTERM to its session) and says why in one line,
  naming the fields that differ; then it starts as usual.

Every server a launcher started this way is recorded while it lives, awake (``front``: the launcher in
front of it) or parked. One small watcher process per server (``python -m hotweights.standby.parked
RECORD``, torch-free) checks every second: an awake server whose launcher is gone without parking it
(killed) is stopped, as a killed ``vllm serve`` would be; a parked one retires after ``--park-idle-s``
seconds, or when the keeper no longer holds its weights in any tier (the entries the keeper lists a
process of its session as parked on). ``hotweights parked`` lists, wakes and retires them.

Not covered: parking a server that the launcher did not start (a plain ``hotweights serve``), engines
of other users (the directory is this user's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..key import FieldDiff
from ..unix import pid_alive
from .fingerprint import Fingerprint

logger = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    return pid_alive(pid, others=False)  # another user's process: not ours to wake or retire


WAKE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Record:
    pid: int
    url: str  # http://host:port of the server
    engine: str  # "hotweights" | "vllm"
    start: dict[str, str]  # Fingerprint.to_wire() of its start
    level: int
    log: str
    parked_at: float
    idle_s: float = 3600.0
    keys: tuple[str, ...] = ()  # short keys of the entries it is parked on (the keeper's Park notes)
    front: int = 0  # the launcher in front of it while it is awake (0: parked)
    watcher: int = 0

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.from_wire(self.start)


def parked_dir(daemon_dir: Path) -> Path:
    path = daemon_dir / "parked"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def records(directory: Path) -> list[Record]:
    """The parked engines recorded in ``directory`` whose process is alive (records of dead ones go)."""
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = _read(path)
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if _alive(record.pid):
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return found


def _read(path: Path) -> Record:
    raw = json.loads(path.read_text())
    return Record(**{**raw, "keys": tuple(raw.get("keys", ()))})


def start_fingerprint(engine: str, args: dict[str, Any], packages: tuple[str, ...],
                      env_prefixes: tuple[str, ...] = ()) -> Fingerprint:
    """What a parked engine must share with a start to take it over: ``args`` (every argument of the start,
    the address included), the working directory, the interpreter, packages, environment."""
    base = Fingerprint.of(packages, env_prefixes)
    extra = {f"arg {k}": json.dumps(v, sort_keys=True, default=str) for k, v in args.items()}
    return Fingerprint(tuple(sorted({**dict(base.fields), **extra, "engine": engine, "cwd": os.getcwd()}.items())))


def take_over(directory: Path, start: Fingerprint, url: str) -> Record | None:
    """Wake the parked engine at ``url`` if its start is ``start`` (None if there is none, or it was retired)."""
    for record in records(directory):
        if record.url != url or (record.front and _alive(record.front)):
            continue  # another address, or awake behind another launcher (the port is taken: the start says so)
        diffs = start.diff(record.fingerprint)
        if diffs:
            retire(directory, record, f"its start differs: {_say(diffs)}")
            return None
        began = time.perf_counter()
        try:
            _post(f"{url}/wake_up", timeout=WAKE_TIMEOUT_S)
            _wait_health(url, WAKE_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            retire(directory, record, f"it could not be woken ({exc})")
            return None
        logger.info("Woke a parked engine for this start (pid %d) in %.3f s; serving at %s", record.pid,
                    time.perf_counter() - began, url)
        return record
    return None


def retire(directory: Path, record: Record, why: str) -> None:
    what = "parked engine" if not record.front else "engine"
    logger.info("Retiring the %s at %s (pid %d): %s", what, record.url, record.pid, why)
    _stop(record.pid)
    (directory / f"{record.pid}.json").unlink(missing_ok=True)
    Path(record.log).unlink(missing_ok=True)


def wake(directory: Path, record: Record) -> float:
    """Wake ``record``'s engine where it is (it serves on, with no launcher in front); the seconds it took."""
    began = time.perf_counter()
    _post(f"{record.url}/wake_up", timeout=WAKE_TIMEOUT_S)
    _wait_health(record.url, WAKE_TIMEOUT_S)
    path = directory / f"{record.pid}.json"
    path.with_suffix(".tmp").write_text(json.dumps(asdict(dataclasses.replace(record, level=0, parked_at=0.0))))
    path.with_suffix(".tmp").replace(path)
    return time.perf_counter() - began


def _say(diffs: list[FieldDiff]) -> str:
    text = "; ".join(str(d) for d in diffs[:4])
    return text + (f"; ... and {len(diffs) - 4} more" if len(diffs) > 4 else "")


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
        old = _read(self.path) if self.path.exists() else None
        watcher = old.watcher if old is not None and _alive(old.watcher) else 0
        record = Record(self.pid, self.url, self.engine, self.start.to_wire(), level, str(self.log),
                        time.time() if level else 0.0, self.idle_s, keys, 0 if level else os.getpid(), watcher)
        if not watcher:
            watcher = subprocess.Popen([sys.executable, "-m", "hotweights.standby.parked", str(self.path)],
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
        return None if _alive(self.pid) else 1

    def _park(self, f: Any) -> int:
        try:
            _post(f"{self.url}/sleep?level={self.level}", timeout=120)
        except OSError as exc:
            logger.info("could not park the engine (%s); stopping it", exc)
            _stop(self.pid)
            self._copy(f)
            self.path.unlink(missing_ok=True)
            return self._exit_code() or 0
        self._copy(f)
        self._record(self.level, tuple(_parked_keys(self.directory.parent, self.pid)))
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


def strip_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its optional numeric value (``--flag``, ``--flag N``, ``--flag=N``)."""
    out, skip = [], False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token == flag:
            skip = i + 1 < len(argv) and _is_number(argv[i + 1])
            continue
        if token.startswith(flag + "="):
            continue
        out.append(token)
    return out


def flag_value(argv: list[str], flag: str, bare: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``bare`` when it is given without one), None when absent."""
    value = None
    for i, token in enumerate(argv):
        if token == flag:
            value = argv[i + 1] if i + 1 < len(argv) and _is_number(argv[i + 1]) else bare
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parked_keys(daemon_dir: Path, session: int) -> list[str]:
    """Short keys of the entries the keeper lists a process of ``session`` as parked on."""
    from ..client import connect
    from ..errors import HotweightsError
    from ..paths import daemon_paths

    try:
        with connect(daemon_paths(daemon_dir)) as client:
            rows = client.status().rows()
    except (HotweightsError, OSError):
        return []
    return [r.key for r in rows if any(_session_of(int(note.split(":")[0])) == session
                                       for note in r.parked.split(",") if note)]


def _session_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])  # state ppid pgrp session
    except (OSError, ValueError, IndexError):
        return -1


def watch(path: Path, interval_s: float = 1.0) -> str:
    """The watcher of one server: stop it when its launcher is gone without parking it; retire it, parked, after
    its idle time or once the keeper holds none of its entries; return (why) when it or its record is gone."""
    from ..client import connect
    from ..errors import HotweightsError
    from ..paths import daemon_paths

    while True:
        time.sleep(interval_s)
        try:
            record = _read(path)
        except (OSError, ValueError, TypeError):
            return "the record is gone"
        if record.watcher not in (0, os.getpid()):
            return "another watcher follows it"
        if not _alive(record.pid):
            path.unlink(missing_ok=True)
            return "the engine is gone"
        why = ""
        if record.front:
            if not _alive(record.front):
                why = "its launcher went away without parking it"
        elif not record.level:
            pass  # woken where it is (hotweights parked --wake): it serves until retired
        elif time.time() - record.parked_at > record.idle_s:
            why = f"parked for {record.idle_s:.0f} s (--park-idle-s)"
        elif record.keys:
            try:
                with connect(daemon_paths(path.parent.parent)) as client:
                    held = {r.key for r in client.status().rows() if r.nbytes or r.host_nbytes}
                if not held & set(record.keys):
                    why = "the keeper no longer holds its weights (released)"
            except (HotweightsError, OSError):  # a keeper that is restarting is not a released entry
                pass
        if why:
            retire(path.parent, record, why)
            return why


def launch(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The server, in its own session (the terminal's Ctrl-C reaches only the launcher), writing to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _post(url: str, timeout: float) -> None:
    req = urllib.request.Request(url, method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        raise OSError(f"{url} answered {exc.code}: {exc.read()[:300]!r}") from None


def _wait_health(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.02)


def _stop(pid: int, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's session (it leads one), SIGKILL after ``grace_s``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch(Path(sys.argv[1]))
