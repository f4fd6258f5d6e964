"""``hotweights serve --park-on-exit``: Ctrl-C parks the server, the same start wakes it, another start retires
it; a parked server retires when its weights leave the keeper or after its idle time; ``hotweights parked``
lists and retires. Real launchers, servers and a daemon in subprocesses (``parked/records.py``).

Run: pytest tests/test_parked.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import DaemonProc, run_cli

from ports import free_port

pytestmark = pytest.mark.slow  # a daemon, launchers and servers in subprocesses

PROMPT = {"prompt": "The weight cache", "max_tokens": 8, "temperature": 0}


class Launcher:
    def __init__(self, model: Path, sock: Path, port: int, log: Path, *args: str, **config: float) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log
        self.started = time.perf_counter()
        extra = json.dumps({"socket_dir": str(sock), "fallback": False, **config})
        self.proc = subprocess.Popen([sys.executable, "-m", "hotweights", "serve", str(model), "--port", str(port),
                                      "--served-model-name", "tiny", "--model-loader-extra-config", extra,
                                      "--park-on-exit", *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.ready_s = wait_health(self.url, self.proc) - self.started

    def output(self, wait_for: str = "", timeout_s: float = 10) -> str:
        """What the launcher wrote (once it holds ``wait_for``: it may say so just after /health answers)."""
        deadline = time.monotonic() + timeout_s
        while wait_for not in (text := self.log_path.read_text(errors="replace")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return text

    def interrupt(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(60)


def wait_health(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 120) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return time.perf_counter()
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"{url} never became healthy")


def complete(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(PROMPT).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]["message"].split(";")[0]


def parked(sock: Path) -> list[dict]:
    done = run_cli("parked", "--json", "--socket-dir", str(sock))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["parked"]


def gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def keeper(models):
    sock = Path(tempfile.mkdtemp(prefix="hwk-", dir="/tmp"))
    daemon = DaemonProc(sock)
    assert run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(sock)).returncode == 0
    yield sock
    run_cli("parked", "--retire", "all", "--socket-dir", str(sock))
    daemon.stop()
    shutil.rmtree(sock, ignore_errors=True)


def test_ctrl_c_parks_the_same_start_wakes_it_and_another_start_retires_it(models, keeper, tmp_path):
    sock, port = keeper, free_port()
    first = Launcher(models["small"], sock, port, tmp_path / "1.log")
    status, expected = complete(first.url)
    assert status == 200
    assert first.interrupt() == 0 and "Parked the engine at" in first.output()
    (record,) = parked(sock)
    assert record["level"] == 1 and record["pid"] != first.proc.pid  # the server outlived its launcher
    header, line = run_cli("parked", "--socket-dir", str(sock)).stdout.splitlines()  # the table, as a person reads it
    assert header.split() == ["PID", "ENGINE", "URL", "STATE", "MODEL"]
    assert line.startswith(f"{record['pid']:<8}hotweights ") and ", parked at level 1, " not in line
    assert " parked at level 1, " in line and line.endswith(str(models["small"])), line
    assert complete(first.url) == (503, "the engine is sleeping")  # it keeps the port, parked
    plain = subprocess.run([sys.executable, "-m", "hotweights", "serve", str(models["small"]), "--port", str(port),
                            "--model-loader-extra-config", json.dumps({"socket_dir": str(sock)})],
                           capture_output=True, text=True, timeout=60)  # a start that is no take-over: it says who
    assert plain.returncode == 2 and plain.stderr.strip().splitlines() == [
        f"hotweights serve: cannot listen on 127.0.0.1:{port} (Address already in use): another process has the "
        f"port; stop it or pass another --port; it is a hotweights engine parked at level 1 (pid {record['pid']}): "
        f"`hotweights parked --retire {record['pid']}` stops it"], plain.stderr

    second = Launcher(models["small"], sock, port, tmp_path / "2.log")
    woke = f"Woke a parked engine for this start (pid {record['pid']})"
    assert woke in second.output(woke)
    assert complete(second.url) == (200, expected)
    assert [(r["pid"], r["level"], r["launcher"]) for r in parked(sock)] == [(record["pid"], 0, second.proc.pid)]
    print(f"take-over ready in {second.ready_s:.3f} s (cold start {first.ready_s:.3f} s)")
    assert second.interrupt(signal.SIGTERM) == 0 and [r["level"] for r in parked(sock)] == [1]

    third = Launcher(models["small"], sock, port, tmp_path / "3.log", "--max-model-len", "48")
    retired = (f"Retiring the parked engine at {third.url} (pid {record['pid']}): its start differs: "
               f"arg max_model_len: cached=null requested=48")
    assert retired in third.output(retired)
    assert gone(record["pid"]) and complete(third.url)[0] == 200
    assert third.interrupt() == 0
    (again,) = parked(sock)
    done = run_cli("parked", "--retire", "all", "--json", "--socket-dir", str(sock))
    assert json.loads(done.stdout)["retired"] == [again["pid"]] and gone(again["pid"]) and parked(sock) == []


def test_a_server_whose_launcher_is_killed_is_stopped_not_left_behind(models, keeper, tmp_path):
    launcher = Launcher(models["small"], keeper, free_port(), tmp_path / "k.log")
    (record,) = parked(keeper)
    assert record["level"] == 0 and record["launcher"] == launcher.proc.pid
    launcher.proc.kill()  # SIGKILL: no park; the watcher stops the server, as a killed `vllm serve` would go
    launcher.proc.wait()
    assert gone(record["pid"]) and parked(keeper) == []


def test_a_parked_server_retires_when_its_weights_are_released_or_its_idle_time_ends(models, keeper, tmp_path):
    sock = keeper
    idle = Launcher(models["small"], sock, free_port(), tmp_path / "idle.log", "--park-idle-s", "2")
    assert idle.interrupt() == 0
    (record,) = parked(sock)
    assert gone(record["pid"]) and parked(sock) == []  # parked for 2 s: retired by itself

    deep = Launcher(models["small"], sock, free_port(), tmp_path / "deep.log", "--park-on-exit", "2")
    assert deep.interrupt() == 0
    (record,) = parked(sock)
    assert record["level"] == 2
    assert run_cli("release", "--all", "--socket-dir", str(sock)).returncode == 0
    assert gone(record["pid"]) and parked(sock) == []  # its weights left the keeper: it retired


def test_a_wake_that_cannot_map_its_weights_says_why_and_leaves_it_parked(models, keeper, tmp_path):
    """A deep-parked server whose keeper does not answer (stopped, SIGSTOP: slower than the engine's 1 s
    timeout): ``parked --wake`` says why in one line and the server stays parked (a keeper that does not
    answer is not a released entry); once it answers again the same command wakes it."""
    sock = keeper
    deep = Launcher(models["small"], sock, free_port(), tmp_path / "deep.log", "--park-on-exit", "2",
                    state_timeout_s=1.0)
    status, expected = complete(deep.url)
    assert status == 200 and deep.interrupt() == 0
    (record,) = parked(sock)
    daemon_pid = int((sock / "daemon.lock").read_text())
    os.kill(daemon_pid, signal.SIGSTOP)
    try:
        done = run_cli("parked", "--wake", str(record["pid"]), "--socket-dir", str(sock))
    finally:
        os.kill(daemon_pid, signal.SIGCONT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"could not wake pid {record['pid']}: ") and "(it is still parked)" in done.stdout
    assert complete(deep.url) == (503, "the engine is sleeping")
    assert run_cli("parked", "--wake", str(record["pid"]), "--socket-dir", str(sock)).returncode == 0
    assert complete(deep.url) == (200, expected)


def test_vllm_cpu_build_refuses_park_on_exit_in_one_line(models):
    """vLLM's CPU build has no sleep mode: ``hotweights vllm serve --park-on-exit`` says so before vLLM starts."""
    from conftest import VLLM_PYTHON

    if not VLLM_PYTHON:
        pytest.skip("set HOTWEIGHTS_VLLM_PYTHON (make test does)")
    done = subprocess.run([VLLM_PYTHON, "-m", "hotweights", "vllm", "serve", str(models["small"]), "--park-on-exit"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    assert done.returncode != 0 and "--park-on-exit needs vLLM's sleep mode, which its CPU build does not have" \
        in done.stderr
