"""A real ``hotweights switch`` front in a subprocess, for the switch's tests (tests/test_switch*.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ports import free_port


class Front:
    def __init__(self, tmp: Path, models: dict[str, Path], *args: str, socket_dir: Path,
                 engine_args: tuple[str, ...] = ("--max-model-len", "64"), wait: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"front-{self.port}.log"
        pairs = [x for name, path in models.items() for x in ("--model", f"{name}={path}")]
        tail = ["--", *engine_args] if models else []  # else a --config file names them
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hotweights", "switch", *pairs, "--port", str(self.port), "--log-dir",
             str(tmp / f"logs-{self.port}"), *args, *tail],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, "HOTWEIGHTS_SOCKET_DIR":
                                                                         str(socket_dir)})
        deadline = time.monotonic() + 120
        while wait and not self.ready():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.2)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def status(self, key: str = "") -> dict:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + "/switch/status", headers=headers)) as r:
            return json.loads(r.read())

    def state(self, name: str) -> dict:
        return next(m for m in self.status()["models"] if m["name"] == name)

    def client(self, key: str = "none"):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def answer(client, model: str) -> tuple[str, list[float]]:
    """The greedy text and its token logprobs: two demo models of one shape differ in the second."""
    got = client.completions.create(model=model, prompt="The weight cache", max_tokens=6, temperature=0, logprobs=1)
    assert got.model == model
    return got.choices[0].text, [round(x, 4) for x in got.choices[0].logprobs.token_logprobs]


def checkpoint_names(path: Path) -> Path:
    """A directory the switch's config check takes for a checkpoint (the names it looks for: config.json, a
    safetensors file and a tokenizer), for tests of the configuration that start nothing."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer.json").write_text("{}")
    return path


@contextlib.contextmanager
def private_keeper(prefix: str):
    """A keeper directory of the tests' own (short: AF_UNIX paths are capped), its keeper stopped after."""
    from conftest import run_cli

    sock = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield sock
    finally:
        run_cli("stop", "--socket-dir", str(sock))


def wait_started(front: Front, timeout_s: float = 120) -> Front:
    """Until every model is past start-up (/health is 200 once the default serves; the others may still start)."""
    deadline = time.monotonic() + timeout_s
    while any(m["state"] == "starting" for m in front.status()["models"]):
        assert time.monotonic() < deadline, front.status()
        time.sleep(0.2)
    return front
