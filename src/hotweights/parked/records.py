"""Parked engines: a start asked to park on exit (``--park-on-exit``) leaves its server parked, and the next
run of the same start wakes it and serves on the same address instead of starting again.

Runs in the hotweights CLI process, torch-free. With ``--park-on-exit`` the server runs as a child in its
own session, writing to a log file that the launcher copies to its own output; the launcher stays in
front. Ctrl-C, SIGTERM or SIGHUP to the launcher parks the server (``POST /sleep?level=N``), records it in
``<daemon dir>/parked/<pid>.json`` and returns 0; the server keeps its port and waits (``503
the engine is sleeping`` to generations). Without ``--park-on-exit`` nothing of this happens: Ctrl-C stops and
frees everything, as always.

The next launch of a start on that address reads the record:

- the same start (``Fingerprint``: every argument of the start, the interpreter, the engine's packages,
  the environment that changes it): it wakes the parked server (``POST /wake_up``), waits for
  ``/health``, and stays in front of it as if it had started it (``Woke a parked engine ...`` line);
- another start: it retires the parked one first (SIGTERM to its session) and says why in one line,
  naming the fields that differ; then it starts as usual.

Every server a launcher started this way is recorded while it lives, awake (``front``: the launcher in
front of it) or parked. One small watcher process per server (``python -m hotweights.parked.watch
RECORD``, torch-free) checks every second: an awake server whose launcher is gone without parking it
(killed) is stopped, as a killed ``vllm serve`` would be; a parked one retires after ``--park-idle-s``
seconds, or when the keeper no longer holds its weights in any tier (the entries the keeper lists a
process of its session as parked on). ``hotweights parked`` lists, wakes and retires them.

Not covered: parking a server that the launcher did not start (a plain ``hotweights serve``), engines
of other users (the directory is this user's).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import evidence
from ..argv import Option
from ..key import FieldDiff
from ..observe import PortBusy, listen, post, wait_healthy
from ..unix import pid_alive, stop_group
from ..standby.fingerprint import Fingerprint

logger = logging.getLogger(__name__)


def alive(pid: int) -> bool:
    return pid_alive(pid, others=False)  # another user's process: not ours to wake or retire


WAKE_TIMEOUT_S = 60.0
# hotweights' own options on a server's command line, taken out before the server sees it
PARK_ON_EXIT = Option(("--park-on-exit",), "number")  # [1|2]
PARK_IDLE_S = Option(("--park-idle-s",))


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
            record = read_record(path)
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if alive(record.pid):
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return found


def take_port(host: str, port: int, socket_dir: str | None) -> socket.socket:
    """``observe.listen``; PortBusy names a parked engine of this user that holds the port, and how to stop it."""
    from urllib.parse import urlsplit

    from ..paths import daemon_paths

    try:
        return listen(host, port)
    except PortBusy as exc:
        directory = daemon_paths(socket_dir).directory / "parked"
        held = [r for r in records(directory) if urlsplit(r.url).port == port] if directory.is_dir() else []
        if not held:
            raise
        r = held[0]
        state = f"parked at level {r.level}" if r.level else "awake behind a --park-on-exit launcher"
        raise PortBusy(f"{exc}; it is a {r.engine} engine {state} (pid {r.pid}): `hotweights parked --retire "
                       f"{r.pid}` stops it") from None


def read_record(path: Path) -> Record:
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
        if record.url != url or (record.front and alive(record.front)):
            continue  # another address, or awake behind another launcher (the port is taken: the start says so)
        diffs = start.diff(record.fingerprint)
        if diffs:
            retire(directory, record, f"its start differs: {_say(diffs)}")
            return None
        began = time.perf_counter()
        try:
            post(f"{url}/wake_up", WAKE_TIMEOUT_S)
            wait_healthy(url, WAKE_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            retire(directory, record, f"it could not be woken ({wake_refusal(record, exc)})")
            return None
        logger.info("Woke a parked engine for this start (pid %d) in %.3f s; serving at %s", record.pid,
                    time.perf_counter() - began, url)
        return record
    return None


def retire(directory: Path, record: Record, why: str) -> None:
    what = "parked engine" if not record.front else "engine"
    logger.info("Retiring the %s at %s (pid %d): %s", what, record.url, record.pid, why)
    stop(record.pid)
    (directory / f"{record.pid}.json").unlink(missing_ok=True)
    Path(record.log).unlink(missing_ok=True)


def wake(directory: Path, record: Record) -> float:
    """Wake ``record``'s engine where it is (it serves on, with no launcher in front); the seconds it took."""
    began = time.perf_counter()
    post(f"{record.url}/wake_up", WAKE_TIMEOUT_S)
    wait_healthy(record.url, WAKE_TIMEOUT_S)
    path = directory / f"{record.pid}.json"
    path.with_suffix(".tmp").write_text(json.dumps(asdict(dataclasses.replace(record, level=0, parked_at=0.0))))
    path.with_suffix(".tmp").replace(path)
    return time.perf_counter() - began


def wake_refusal(record: Record, exc: Exception) -> str:
    """Why a wake failed, for a person: the engine's own refusal line from its log when it wrote one (vLLM's
    server answers a failed wake with a bare 500), else the error; and whether it is still parked."""
    try:
        text = "\n".join(Path(record.log).read_text(errors="replace").splitlines()[-400:])
    except OSError:
        text = ""
    refusal = evidence.wake_refusal(text)
    said = f"hotweights: {refusal.reason}" if refusal else str(exc)
    still = _is_sleeping(record.url)
    return said + ("" if still is None else " (it is still parked)" if still else " (it is awake)")


def _is_sleeping(url: str) -> bool | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/is_sleeping", timeout=5) as r:
            return bool(json.loads(r.read()).get("is_sleeping"))
    except (OSError, ValueError):
        return None


def _say(diffs: list[FieldDiff]) -> str:
    text = "; ".join(str(d) for d in diffs[:4])
    return text + (f"; ... and {len(diffs) - 4} more" if len(diffs) > 4 else "")


def stop(pid: int, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's session (it leads one), SIGKILL after ``grace_s``."""
    stop_group(pid, grace_s)
