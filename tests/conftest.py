"""Shared fixtures: private socket dirs, real daemons in subprocesses, demo checkpoints."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hotweights.client import connect
from hotweights.errors import DaemonUnavailable
from ports import free_port
from hotweights.paths import DaemonPaths

# a suite started as a background job of a non-interactive shell inherits SIGINT ignored, and so would every
# server it starts (exec keeps an ignored signal): the tests that send Ctrl-C would then wait out their grace
# or see uvicorn re-raise an ignored signal (exit 0). Caught here, it is the default again in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def _private_digest_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["HOTWEIGHTS_CACHE_DIR"] = str(tmp_path_factory.mktemp("digests"))
    os.environ.pop("HOTWEIGHTS_SOCKET_DIR", None)


def open_fds() -> set[int]:
    """The fds this process holds. A test asserts ``open_fds() <= before``: nothing it opened is left open. Not a
    count: under pytest-xdist a test saw 22 fds before and 21 after, though it closed all it opened (an fd of the
    worker's, or of a test before it, closed meanwhile); a set tells the two apart."""
    gc.collect()  # a socket or file object dropped before is closed now, not by a collection in the middle
    held = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the listing's own fd, closed by now
            continue
        held.add(int(name))
    return held


@pytest.fixture
def pair():
    """Two connected Unix stream sockets (a stand-in peer for wire and client tests)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def socket_dir() -> Path:
    # AF_UNIX paths are capped at 108 bytes: keep them short, not under pytest's tmp_path
    d = Path(tempfile.mkdtemp(prefix="hw-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class DaemonProc:
    def __init__(self, socket_dir: Path, *extra: str, max_fds: int | None = None) -> None:
        self.paths = DaemonPaths(socket_dir)
        self.log_path = socket_dir / "test-daemon.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--socket-dir", str(socket_dir),
                                      *extra], stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=(lambda: _limit_fds(max_fds)) if max_fds else None)
        deadline = time.monotonic() + 20
        while True:
            try:
                connect(self.paths).close()
                return
            except DaemonUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon did not start: {self.log()}") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def num_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def _limit_fds(n: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


@pytest.fixture
def daemon(socket_dir: Path) -> DaemonProc:
    d = DaemonProc(socket_dir)
    yield d
    d.stop()


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from hotweights.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("models")
    return {size: write_demo_model(root / size, size) for size in ("tiny", "small")}


@pytest.fixture
def model_copy(models: dict[str, Path], tmp_path: Path):
    """A private copy of a demo model that a test may modify."""
    def make(size: str) -> Path:
        dst = tmp_path / f"{size}-copy"
        shutil.copytree(models[size], dst)
        return dst
    return make


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hotweights", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def pytest_collection_modifyitems(config, items):
    # modules with a slow test first, whole and in their own order: pytest-xdist (`make test`) hands out modules as
    # its workers come free, so the long ones (real vLLM starts) begin at once and the fast ones fill the gaps at
    # the end, rather than one worker running the last vLLM module alone
    slow = {item.module for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.module not in slow)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


class ServerProc:
    """``hotweights serve`` in a subprocess; ready when /health answers 200."""

    def __init__(self, model: Path, log_path: Path, *args: str, timeout_s: float = 120) -> None:
        import urllib.request

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "hotweights", "serve", str(model), "--port",
                                      str(self.port), *args], stdout=self._log, stderr=subprocess.STDOUT)
        self.ready = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    self.ready = r.status == 200
                    break
            except OSError:
                time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict | bytes) -> tuple[int, dict]:
        import json
        import urllib.error
        import urllib.request

        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def warm_server(models, tmp_path_factory):
    """``hotweights serve`` of the small demo model (as ``tiny``, 64 tokens of context), its weights from a
    daemon's cache, strictly (no disk fallback); one per test module."""
    import json

    sock = Path(tempfile.mkdtemp(prefix="hws-", dir="/tmp"))
    d = DaemonProc(sock)
    preloaded = run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(sock))
    assert preloaded.returncode == 0, preloaded.stderr
    server = ServerProc(models["small"], tmp_path_factory.mktemp("srv") / "s.log", "--served-model-name", "tiny",
                        "--max-model-len", "64", "--model-loader-extra-config",
                        json.dumps({"socket_dir": str(sock), "fallback": False}))
    assert server.ready, server.log()
    yield server
    server.stop()
    d.stop()


# -- real vLLM (CPU build), in the venvs `make test` builds ------------------------------------------------

VLLM_PYTHON = os.environ.get("HOTWEIGHTS_VLLM_PYTHON")
VLLM026_PYTHON = os.environ.get("HOTWEIGHTS_VLLM026_PYTHON")


def needs_vllm(python: str | None, variable: str = "HOTWEIGHTS_VLLM_PYTHON") -> list:
    """The marks of a module that runs real vLLM: slow, and skipped unless ``variable`` names its Python."""
    return [pytest.mark.slow, pytest.mark.skipif(not python, reason=f"set {variable} (make test does)")]


def vllm_command(model: Path, port: int, *args: str, python: str | None = None, launcher: bool = False) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server --model M ...``, or with ``launcher`` ``python -m
    hotweights vllm serve M ...``: eager, bf16, 256 tokens of context (what a CPU test can afford)."""
    head = ["-m", "hotweights", "vllm", "serve", str(model)] if launcher else \
        ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [python or VLLM_PYTHON or "", *head, "--port", str(port), "--enforce-eager", "--dtype", "bfloat16",
            "--max-model-len", "256", *args]


def ask(port: int, model: Path) -> str:
    """One greedy completion of 16 tokens: what every vLLM start in the suite must answer alike."""
    import json
    import urllib.request

    body = {"model": str(model), "prompt": "The weight cache", "max_tokens": 16, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


# vLLM's own switch for its engine core in the API server's process instead of a fresh interpreter: about 15 s
# less per start on this 2-core machine (38-43 s -> 23-27 s, the same answer). For tests whose property is not
# the process layout; the standby, hand-off, TP and DP tests run vLLM's default.
ENGINE_IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def serves(port: int, model: Path) -> bool:
    """Whether the server on ``port`` serves ``model``: a port picked free may be taken by another test's server
    (the other xdist worker's fronts and engines) in the minute a vLLM start takes to bind it, and that server's
    ``/health`` then answers for it (a TP=2 start on CI was asked its completion there: 404, no such model)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
            return str(model) in {m.get("id") for m in json.loads(r.read()).get("data", [])}
    except (OSError, ValueError):
        return False


def port_taken(obs, ready: bool, port: int, model: Path) -> bool:
    """Whether another process took the port picked for ``obs``'s server: another server answers on it
    (``serves``), or the server exited on ``Address already in use`` (CI, 2026-12-05: vLLM's bind failed while
    the other worker's server answered ``/health``)."""
    if ready:
        return not serves(port, model)
    return "Address already in use" in obs.log_text()


def serve_vllm(label: str, model: Path, out: Path, *args: str, expect_ready: bool = True,
               env: dict[str, str] | None = None, python: str | None = None, launcher: bool = False):
    """A vLLM server (``vllm_command``) started, asked once, stopped: ``(its Observed, the answer)``. Started
    again on another port, once, where another process took the one picked (``port_taken``)."""
    from hotweights.observe import Observed

    for attempt in (1, 2):
        port = free_port()
        obs = Observed(label, vllm_command(model, port, *args, python=python, launcher=launcher), out_dir=out,
                       health_url=f"http://127.0.0.1:{port}/health",
                       env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})
        receipt = obs.wait_ready(timeout_s=300, interval_s=0.5)
        if attempt == 1 and port_taken(obs, receipt.ready, port, model):
            obs.stop(grace_s=20)
            continue
        answer = ask(port, model) if receipt.ready else None
        obs.stop(grace_s=20)
        assert receipt.ready == expect_ready, obs.log_text()[-3000:]
        return obs, answer
    raise AssertionError("unreachable: the second attempt returns")


def serve_vllm_in_process(*args, **kwargs):
    """``serve_vllm`` with vLLM's engine core in-process (``ENGINE_IN_PROCESS``)."""
    return serve_vllm(*args, **{**kwargs, "env": {**ENGINE_IN_PROCESS, **kwargs.get("env", {})}})
