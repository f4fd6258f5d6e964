"""``hotweights switch`` with vLLM's CPU build behind it (real vLLM 0.32, in its own venv): vLLM's CPU build has no
sleep mode, so a switch away from its model stops the engine and a request for it starts it again (from the
warm standby); the status says so, and it answers as before. Its preload runs beside the embedded model's
(``preload_jobs = 2``), its KV cache pinned. With ``preempt``, a stream of vLLM's paused for the other model is
continued by vLLM's next start from its token ids (``return_token_ids``), the same greedy text.

Run: HOTWEIGHTS_VLLM_PYTHON=~/.cache/hotweights/vllm-venv/bin/python pytest tests/test_switch_vllm.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ENGINE_IN_PROCESS, VLLM_PYTHON, needs_vllm, run_cli

from ports import free_port

pytestmark = needs_vllm(VLLM_PYTHON)


def completion(url: str, model: str) -> str:
    body = {"model": model, "prompt": "The weight cache", "max_tokens": 8, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        got = json.loads(r.read())
    assert got["model"] == model
    return got["choices"][0]["text"]


def preempted(url: str, log: Path) -> tuple[str, list[str]]:
    """A stream of ``v`` alone, then the same stream with ``e`` asked once it has begun (``preempt``: ``v`` leaves
    at once, its stream paused; with no sleep mode in vLLM's CPU build ``v`` stops, and its next start continues
    the stream), until a pause happened (a small model on a loaded machine may end its stream before ``e``'s
    request is in; at most three tries): the text alone and each try's."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    ask = {"model": "v", "prompt": "The weight cache", "max_tokens": 200, "temperature": 0, "stream": True}
    plain = "".join(c.choices[0].text for c in client.completions.create(**ask) if c.choices)
    tries = []
    for _ in range(3):
        other = threading.Thread(target=lambda: completion(url, "e"))
        chunks = []
        for chunk in client.completions.create(**ask):
            chunks.append(chunk)
            if len(chunks) == 1:
                other.start()
        other.join()
        assert {c.id for c in chunks} == {chunks[0].id}  # one stream, as the client sees it
        tries.append("".join(c.choices[0].text for c in chunks if c.choices))
        deadline = time.monotonic() + 10
        while "paused 1 time(s)" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)  # the request's line comes once its relay has ended, just after its client read the end
        if "paused 1 time(s)" in log.read_text():
            break
    return plain, tries


def stopped_without_its_standbys(front: subprocess.Popen, log: Path, sock: Path) -> None:
    """Issue 68: the front retires the warm standbys its engines prepared (4 of 0.6-1.0 GiB each were left
    behind), and its last line names what it leaves running."""
    from hotweights.engines.vllm.standby import SPEC
    from hotweights.standby import handoff

    assert handoff.holders(SPEC, sock)  # the last start prepared one for the next
    front.send_signal(signal.SIGINT)
    assert front.wait(120) in (0, 130)
    assert handoff.holders(SPEC, sock) == []
    lines = [x for x in log.read_text().splitlines() if "hotweights.switch" in x]
    assert re.search(r"retired \d+ warm standby\(s\) of vllm", "\n".join(lines[-4:])), lines[-4:]
    assert "left running: the keeper (pid " in lines[-1] and "standby" not in lines[-1], lines[-1]


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
preempt = true
turn_s = 0.02  # a turn well within v's stream (200 tokens in ~0.1 s on an idle 2-core machine: 0.1 let it end first)
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
        plain, tries = preempted(url, log)
        assert tries == [plain] * len(tries)  # greedy: continued from its token ids on vLLM started again, the same
        text = log.read_text()
        assert re.search(r"v: a stream paused after \d+ token\(s\)", text) and "paused 1 time(s)" in text, text
        assert re.search(r"v ready in [\d.]+ s \(cached, [\d.]+ s; started from a warm standby, [\d.]+ s; awake\)",
                         text), text
        assert "v awake in" in text and "(weights start;" in text
        assert "e: preloading beside 1 other preload(s)" in text  # its preload ran beside v's vLLM preload
        preload_log = (sock / "vllm-preload-small.log").read_text()  # named by its model: preloads run beside
        # vLLM's loader alone, no vLLM start (publish.py): no KV cache to profile beside e's preload
        assert '"tensors": 51' in preload_log and "kv_cache" not in preload_log.lower()
        engine_log = Path(status()["v"]["log"]).read_text()
        assert engine_log.count("Started vLLM from a warm standby") >= 1 and "Mapped " in engine_log
        stopped_without_its_standbys(front, log, sock)
    finally:
        if front.poll() is None:
            front.send_signal(signal.SIGINT)
            front.wait(120)
        run_cli("stop", "--socket-dir", str(sock))
        # the standby the last start prepared waits for the next start, as it should; this test has none
        subprocess.run([VLLM_PYTHON, "-m", "hotweights", "standby", "--stop", "--socket-dir", str(sock)],
                       capture_output=True, timeout=60)


def test_vllm_args_its_parser_refuses_and_heads_its_cpu_build_cannot_serve_are_refused_before_anything_starts(
        tmp_path):
    """Issue 68: ``--max-modl-len`` passed the front's check and failed at the engine's start; a ``--size tiny``
    demo model (head size 16) with vLLM's CPU build reported ready, then failed every request. Both are now one line
    from vLLM's own parser and attention backend, before the front binds its port or preloads anything."""
    from hotweights.demo_model import write_demo_model

    small, tiny = write_demo_model(tmp_path / "small", "small"), write_demo_model(tmp_path / "tiny", "tiny")
    cache = tmp_path / "cache"

    def refused(checkpoint: Path, *args: str) -> str:
        config = tmp_path / "switch.toml"
        config.write_text(f'[[model]]\nname = "v"\ncheckpoint = "{checkpoint}"\nengine = "vllm"\n'
                          f"args = {json.dumps(list(args))}\n")
        sock = tempfile.mkdtemp(prefix="hwva-", dir="/tmp")
        done = subprocess.run([VLLM_PYTHON, "-m", "hotweights", "switch", "--config", str(config), "--port",
                               str(free_port())], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock, "HOTWEIGHTS_CACHE_DIR": str(cache)})
        lines = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and len(lines) == 1, done.stderr[-3000:]
        assert not Path(sock, "daemon.sock").exists()  # nothing preloaded: no keeper started
        return lines[0]

    said = refused(small, "--max-modl-len", "512")
    assert "model v: --max-modl-len is not an argument of vLLM (did you mean --max-model-len?)" in said, said
    said = refused(small, "--dtype", "wat")
    assert "model v: vLLM refuses its args: argument --dtype: invalid choice: 'wat'" in said, said
    said = refused(tiny, "--max-model-len", "512")
    assert "model v: its attention head size 16 is not one vLLM's CPU build serves" in said, said
    assert "--size small" in said
    # each verdict is kept: the same question again asks nothing of vLLM (22 s of import on an H100 box)
    asked_again = subprocess.run([VLLM_PYTHON, "-c", f"""
import json, subprocess
from hotweights.engines.vllm.argcheck import checked
def no_vllm(*a, **k):
    raise AssertionError("vLLM was asked again")
subprocess.run = no_vllm
print(json.dumps(checked([{{"name": "v", "args": ["--max-modl-len", "512"], "checkpoint": "{small}"}},
                          {{"name": "w", "args": ["--max-model-len", "512"], "checkpoint": "{tiny}"}}], 60)))
"""], capture_output=True, text=True, timeout=120, env={**os.environ, "HOTWEIGHTS_CACHE_DIR": str(cache)})
    assert asked_again.returncode == 0, asked_again.stderr[-2000:]
    again = json.loads(asked_again.stdout.strip().splitlines()[-1])
    assert again["v"].startswith("--max-modl-len is not an argument of vLLM") and "head size 16" in again["w"], again
