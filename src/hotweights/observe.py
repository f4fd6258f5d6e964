"""``hotweights observe LABEL -- CMD``: start a server, time it to ready, keep a receipt.

The command runs in its own process session with stdout+stderr in ``LABEL.log``. The
health URL is polled every ``interval_s``; time-to-ready is measured from just before
the process starts to the first 200, so it includes up to one poll interval. The
receipt ``LABEL.json`` holds label, started_utc, ready, elapsed_s, pid, command (and
exit_code when the process ended early). On the way out the whole process group gets
SIGINT, then SIGKILL after ``grace_s``: nothing is left running.

Stdlib only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .argv import Option
from .unix import signal_group, stop_group

DEFAULT_HEALTH_URL = "http://127.0.0.1:8000/health"


def client_host(host: str) -> str:
    """The address a client on this machine reaches a server bound to ``host`` at: loopback for a wildcard bind."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def health_url_for(command: list[str]) -> str:
    """Where a server started by ``command`` answers ``/health``: its ``--port`` (and ``--host`` unless it
    binds every address), else port 8000 on 127.0.0.1, the default of ``vllm serve`` and ``hotweights serve``."""
    port, host = Option(("--port",)).value(command) or "8000", Option(("--host",)).value(command) or "127.0.0.1"
    return f"http://{client_host(host)}:{port}/health"


def complete(base_url: str, prompt: str, *, max_tokens: int = 16, model: str | None = None,
             timeout_s: float = 120.0) -> str | None:
    """The greedy completion of ``prompt`` from an OpenAI-compatible server, None on any failure."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if model is not None:
        body["model"] = model
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return str(json.loads(r.read())["choices"][0]["text"])
    except (OSError, KeyError, ValueError):
        return None


def floor_s(python: str, device: str = "cpu") -> float:
    """The floor of any server start: seconds from spawning ``python`` until it has imported torch
    (and, on a GPU, created a CUDA context), timed to its signal on stdout so its exit does not count."""
    code = "import torch" + (f"; torch.zeros(1, device={device!r})" if device.startswith("cuda") else "")
    start = time.monotonic()
    proc = subprocess.Popen([python, "-c", code + "; print('ready', flush=True)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()
    elapsed = time.monotonic() - start
    proc.wait()
    if line.strip() != "ready":
        raise RuntimeError(f"the floor command failed: {python} -c {code!r}")
    return elapsed


def require_free_port(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(f"port {port} is busy: another process listens on 127.0.0.1:{port}, and verify must "
                             f"poll only servers it started; stop that process or pass --port "
                             f"(make demo: DEMO_PORT=8001 make demo)") from None


class PortBusy(ValueError):
    """A port another process listens on; the message says which and what to do."""


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, taken before a server loads anything: a busy port is one line at once
    (PortBusy), not an error after minutes of start-up. The server listens on it (uvicorn's ``sockets=``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortBusy(f"cannot listen on {host}:{port} ({exc.strerror}): another process has the port; stop it "
                       f"or pass another --port") from None
    return sock


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Receipt:
    label: str
    started_utc: str
    ready: bool
    elapsed_s: float
    pid: int
    command: list[str]
    exit_code: int | None = None
    log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    health_url: str = ""
    reason: str = ""  # why it is not ready, in one line

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class Observed:
    """A started server command; ``wait_ready`` then ``stop``. Use as a context manager."""

    def __init__(self, label: str, command: list[str], *, out_dir: Path, health_url: str = DEFAULT_HEALTH_URL,
                 env: dict[str, str] | None = None) -> None:
        if not command:
            raise ValueError("observe needs a command after --")
        self.label, self.command, self.health_url = label, list(command), health_url
        out_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = out_dir / f"{label}.log"
        self.json_path = out_dir / f"{label}.json"
        self._log = open(self.log_path, "wb")
        self.started_utc = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **(env or {})})
        except OSError as exc:
            self._log.close()
            raise ValueError(f"cannot start {self.command[0]!r}: {exc.strerror}") from None
        self.receipt = Receipt(label, self.started_utc, False, 0.0, self.proc.pid, self.command,
                               log=str(self.log_path), health_url=health_url)

    def __enter__(self) -> Observed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, *, timeout_s: float = 600.0, interval_s: float = 1.0) -> Receipt:
        deadline = self.t0 + timeout_s
        while True:
            if healthy(self.health_url):
                self.receipt.ready = True
                break
            if self.proc.poll() is not None:
                self.receipt.exit_code = self.proc.returncode
                self.receipt.reason = (f"the command exited with code {self.proc.returncode} before "
                                       f"{self.health_url} answered 200; see {self.log_path}")
                break
            if time.monotonic() >= deadline:
                self.receipt.reason = (f"no 200 from {self.health_url} within {timeout_s:.0f} s (is the server on "
                                       f"another port? pass --health-url); see {self.log_path}")
                break
            time.sleep(interval_s)
        self.receipt.elapsed_s = round(time.monotonic() - self.t0, 3)
        self.write()
        return self.receipt

    def write(self) -> None:
        self.json_path.write_text(self.receipt.to_json() + "\n")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, *, grace_s: float = 30.0) -> int | None:
        """SIGINT the process group, SIGKILL it after ``grace_s``; returns the exit code."""
        stop_group(self.proc.pid, grace_s, first=signal.SIGINT, child=self.proc)
        signal_group(self.proc.pid, signal.SIGKILL)  # stragglers the leader left behind
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` (a server's ``/health``) answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def observe(label: str, command: list[str], *, out_dir: Path, health_url: str = DEFAULT_HEALTH_URL,
            timeout_s: float = 600.0, interval_s: float = 1.0, then: str | None = None,
            exit_when_ready: bool = False, grace_s: float = 30.0) -> Receipt:
    """The ``hotweights observe`` command: print the receipt line, then hold, run ``then``, or stop."""
    obs = Observed(label, command, out_dir=out_dir, health_url=health_url)
    try:
        receipt = obs.wait_ready(timeout_s=timeout_s, interval_s=interval_s)
        print(receipt.to_json(), flush=True)
        if receipt.ready and then:
            receipt.extra["then_exit_code"] = subprocess.call(then, shell=True)
            obs.write()
        elif receipt.ready and not exit_when_ready:
            try:
                obs.proc.wait()
            except KeyboardInterrupt:
                pass
        return receipt
    finally:
        obs.stop(grace_s=grace_s)


def post(url: str, timeout_s: float = 120, body: dict[str, Any] | None = None) -> bytes:
    """A POST (``/sleep``, ``/wake_up``; empty, or ``body`` as JSON); its answer's body. OSError naming the status and
    the body when refused."""
    import urllib.error

    data, headers = (json.dumps(body).encode(), {"content-type": "application/json"}) if body is not None else (b"", {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method="POST"), timeout=timeout_s) as r:
            return bytes(r.read())
    except urllib.error.HTTPError as exc:
        raise OSError(f"{url} answered {exc.code}: {exc.read()[:300]!r}") from None


def wait_healthy(base_url: str, timeout_s: float, interval_s: float = 0.02) -> None:
    """Until ``base_url``/health answers 200; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not healthy(f"{base_url}/health"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base_url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(interval_s)
