"""``hotweights vllm serve`` from a warm standby, against real vLLM (CPU build 0.32).

Properties: a standby start answers like a plain start, also one with ``VLLM_SERVER_DEV_MODE=1`` from a
standby made without it (vLLM reads it after the fork: its dev routes are there); SIGINT to the launcher
stops the server and frees its port; a killed launcher leaves no server behind; a killed standby costs a plain start; a
standby made under another environment is not used. Timings are a benchmark's job
(``benchmarks/vllm_restart.py --launcher``), not this test's.

Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm-venv/bin/python pytest tests/test_vllm_standby.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import VLLM_PYTHON, free_port, needs_vllm, vllm_command
from conftest import ask as answer

from hotweights import evidence
from hotweights.observe import Observed

pytestmark = needs_vllm(VLLM_PYTHON)


def environ(sock: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "HOTWEIGHTS_SOCKET_DIR": str(sock), **(env or {})}


def launch(label: str, model: Path, out: Path, sock: Path, env: dict[str, str] | None = None) -> tuple[Observed, int]:
    port = free_port()
    return Observed(label, vllm_command(model, port, launcher=True), out_dir=out,
                    health_url=f"http://127.0.0.1:{port}/health", env=environ(sock, env)), port


def standby(sock: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    r = subprocess.run([VLLM_PYTHON, "-m", "hotweights", "standby", "--socket-dir", str(sock), "--json", *args],
                       capture_output=True, text=True, timeout=60, env={**os.environ, **environ(sock, env)})
    return json.loads(r.stdout)


def wait_for_standby(sock: Path, env: dict[str, str] | None = None, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = standby(sock, env=env)
        if state["ready"]:
            return state
        time.sleep(1)
    raise AssertionError(f"no standby became ready: {state}; log: {Path(state['log']).read_text()[-3000:]}")


def status_of(port: int, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def port_is_free(port: int, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        time.sleep(0.5)
    return False


@pytest.fixture
def vllm_model(tmp_path_factory):
    from hotweights.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("standby") / "small", "small")


@pytest.mark.timeout(1200)  # three vLLM starts, two standbys importing vLLM
def test_a_standby_start_serves_like_a_plain_one_and_stops_with_its_launcher(vllm_model, socket_dir, tmp_path):
    try:
        # 1. nothing prepared: a plain start, which prepares a standby for the next one
        plain, port = launch("plain", vllm_model, tmp_path, socket_dir)
        assert plain.wait_ready(timeout_s=300, interval_s=0.5).ready, plain.log_text()[-3000:]
        expected = answer(port, vllm_model)
        assert status_of(port, "/server_info") == 404  # vLLM's dev routes: VLLM_SERVER_DEV_MODE is not set
        plain.stop(grace_s=20)
        assert f"{evidence.STANDBY_UNUSED_MARK} (no standby ready" in plain.log_text()
        ready = wait_for_standby(socket_dir)
        assert ready["fits"] and ready["cuda_initialized"] is False and ready["threads"] == 1

        # 2. from the standby: the same answer; Ctrl-C to the launcher stops the server and frees the port. With
        # VLLM_SERVER_DEV_MODE=1 (a start that parks), which vLLM reads after the fork: the standby the plain start
        # left fits, and the server it forks has the dev routes
        warm, port = launch("warm", vllm_model, tmp_path, socket_dir, env={"VLLM_SERVER_DEV_MODE": "1"})
        assert warm.wait_ready(timeout_s=300, interval_s=0.5).ready, warm.log_text()[-3000:]
        used = evidence.STANDBY_USED_RE.search(warm.log_text())
        assert used, warm.log_text()[-3000:]
        assert answer(port, vllm_model) == expected
        assert status_of(port, "/server_info") == 200
        supervisor = used.group(1)  # the standby stays as the server's supervisor; the server is its child
        titles = [Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                  for child in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]
        # in ps as a plain start: our title (python -m vllm.entrypoints... MODEL ...) until vLLM sets its own
        assert any(t.startswith("VLLM") or f" -m vllm.entrypoints.openai.api_server --model {vllm_model}" in t
                   for t in titles) and not any("hotweights.standby" in t for t in titles), titles
        warm.proc.send_signal(signal.SIGINT)  # the launcher alone, as its terminal's Ctrl-C would reach it
        assert warm.proc.wait(60) in (0, 130, -signal.SIGINT), warm.log_text()[-3000:]
        assert port_is_free(port), "the server outlived its launcher's Ctrl-C"

        # a killed launcher and a killed standby: tests/test_vllm_handoff.py (the same hand-off, a probe for vLLM)

        # 3. a standby made under another environment is not used (and is retired)
        wait_for_standby(socket_dir)
        stale, _ = launch("stale", vllm_model, tmp_path, socket_dir, env={"VLLM_HOTWEIGHTS_TEST_KNOB": "1"})
        deadline = time.monotonic() + 60
        while evidence.STANDBY_UNUSED_MARK not in stale.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        stale.stop(grace_s=20)
        assert (f"{evidence.STANDBY_UNUSED_MARK} (stale standby (env VLLM_HOTWEIGHTS_TEST_KNOB: cached=(unset) "
                "requested=1)"
                in stale.log_text()), stale.log_text()[-3000:]
    finally:
        for env in ({}, {"VLLM_HOTWEIGHTS_TEST_KNOB": "1"}):
            standby(socket_dir, "--stop", env=env)
