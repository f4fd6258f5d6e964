"""``hotweights switch`` with vLLM's CPU build behind it (real vLLM 0.32, in its own venv): vLLM's CPU build has no
sleep mode, so a switch away from its model stops the engine and a request for it starts it again (from the
warm standby); the status says so, and it answers as before. Its preload runs beside the embedded model's
(``preload_jobs = 2``), its KV cache pinned.

Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm-venv/bin/python pytest tests/test_switch_vllm.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ENGINE_IN_PROCESS, VLLM_PYTHON, needs_vllm, run_cli

from hotweights.observe import free_port

pytestmark = needs_vllm(VLLM_PYTHON)


def completion(url: str, model: str) -> str:
    body = {"model": model, "prompt": "The weight cache", "max_tokens": 8, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        got = json.loads(r.read())
    assert got["model"] == model
    return got["choices"][0]["text"]


@pytest.mark.timeout(900)
def test_with_vllms_cpu_build_a_switch_stops_its_engine_and_a_request_starts_it_again(tmp_path):
    from hotweights.demo_model import write_demo_model

    small, tiny = write_demo_model(tmp_path / "small", "small"), write_demo_model(tmp_path / "tiny", "tiny")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "switch.toml").write_text(f"""
[switch]
port = {port}
preload_jobs = 2
max_awake = 1
[[model]]
name = "v"
checkpoint = "{small}"
engine = "vllm"
args = ["--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "256"]
[[model]]
name = "e"
checkpoint = "{tiny}"
args = ["--max-model-len", "64"]
""")
    sock = Path(tempfile.mkdtemp(prefix="hwswv-", dir="/tmp"))
    log = tmp_path / "front.log"
    front = subprocess.Popen([VLLM_PYTHON, "-m", "hotweights", "switch", "--config", str(tmp_path / "switch.toml"),
                              "--log-dir", str(tmp_path / "logs")], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             env={**os.environ, "HOTWEIGHTS_SOCKET_DIR": str(sock), "VLLM_CPU_KVCACHE_SPACE": "1",
                                  **ENGINE_IN_PROCESS})

    def status() -> dict:
        with urllib.request.urlopen(f"{url}/switch/status", timeout=10) as r:
            return {m["name"]: m for m in json.loads(r.read())["models"]}

    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if all(m["state"] != "starting" for m in status().values()):
                    break
            except OSError:
                pass
            assert front.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        rows = status()
        assert rows["v"]["state"] == "awake" and not rows["v"]["parks"] and rows["e"]["state"] == "parked"
        first = completion(url, "v")
        completion(url, "e")
        rows = status()
        assert rows["v"]["state"] == "stopped" and rows["v"]["pid"] == 0  # no sleep mode: stopped for e
        assert completion(url, "v") == first  # started again, from the standby
        req = urllib.request.Request(f"{url}/tokenize", data=json.dumps({"model": "v", "prompt": "hi"}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:  # every path vLLM serves is relayed (issue 53)
            assert json.loads(r.read())["tokens"]
        text = log.read_text()
        assert re.search(r"v ready in [\d.]+ s \(cached, [\d.]+ s; started from a warm standby, [\d.]+ s; awake\)",
                         text), text
        assert "v awake in" in text and "(weights start;" in text
        assert "e: preloading beside 1 other preload(s)" in text  # its preload ran beside v's vLLM preload
        preload_log = (sock / "vllm-preload-small.log").read_text()  # named by its model: preloads run beside
        # vLLM's loader alone, no vLLM start (publish.py): no KV cache to profile beside e's preload
        assert '"tensors": 51' in preload_log and "kv_cache" not in preload_log.lower()
        engine_log = Path(status()["v"]["log"]).read_text()
        assert engine_log.count("Started vLLM from a warm standby") >= 1 and "Mapped " in engine_log
    finally:
        front.send_signal(signal.SIGINT)
        front.wait(120)
        run_cli("stop", "--socket-dir", str(sock))
        # the standby the last start prepared waits for the next start, as it should; this test has none
        subprocess.run([VLLM_PYTHON, "-m", "hotweights", "standby", "--stop", "--socket-dir", str(sock)],
                       capture_output=True, timeout=60)
