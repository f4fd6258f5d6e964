"""``hotweights switch`` with vLLM's CUDA build behind it, on a GPU: a stream held across its engine's park keeps its
KV cache (issue 69). Marked ``cuda``: skipped without a GPU and vLLM's CUDA build, run on the GPU machine (``source
/tmp/gpu-vllm/env.sh``).

Run: pytest -m cuda tests/test_switch_vllm_gpu.py
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from switch_front import Front, private_keeper

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's CUDA build")]


def prompt_tokens(port: int) -> float:
    """What a vLLM engine counted of prompts it computed (its ``/metrics``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("vllm:prompt_tokens_total"))


def until_serving(f: Front, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not (f.ready() and all(m["state"] not in ("starting", "preloading") for m in f.status()["models"])):
        assert f.proc.poll() is None and time.monotonic() < deadline, f.log.read_text()[-4000:]
        time.sleep(0.5)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("held_kv", ["gpu", "host"])
def test_a_vllm_stream_held_across_its_engines_park_goes_on_with_its_prompt_computed_once(tmp_path, held_kv):
    """Two 0.6B vLLM models, one awake at a time, both on the host tier, ``--preempt``: a long stream on ``a`` is held
    when ``b``'s request has waited its turn. ``a`` parks with vLLM's scheduler paused and its KV cache kept (``/pause
    ?mode=keep``, ``hotweights_hold``: its weights unmapped, then let go to host memory), ``b`` wakes and answers,
    ``a`` wakes (``hotweights_release``, ``/resume``) and the stream goes on from its next token: the same greedy
    text as unpaused, and ``a``'s engine counted the prompt once more, not twice. The same with ``--held-kv host``:
    the KV cache goes to pinned host memory while ``a`` is parked, and comes back at its wake."""
    models = {}
    for name, seed in (("a", 0), ("b", 1)):
        made = subprocess.run([sys.executable, "-m", "hotweights", "demo-model", str(tmp_path / name), "--size",
                               "0.6b", "--gen-device", "cuda", "--seed", str(seed)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        models[name] = tmp_path / name
    with private_keeper("hwkvg-") as sock:
        f = Front(tmp_path, models, "--engine", "vllm", "--max-awake", "1", "--preempt", "--turn-s", "0.1",
                  "--parked-weights", "host", "--held-kv", held_kv, socket_dir=sock, wait=False,
                  engine_args=("--max-model-len", "4096", "--gpu-memory-utilization", "0.3", "--enforce-eager"))
        try:
            until_serving(f)
            client = f.client()
            ask = {"model": "a", "prompt": "The weight cache", "max_tokens": 3000, "temperature": 0,
                   "extra_body": {"ignore_eos": True}}
            began = time.monotonic()
            plain = client.completions.create(**ask).choices[0].text
            alone_s = time.monotonic() - began
            port = f.state("a")["port"]
            counted = prompt_tokens(port)
            got: dict[str, float] = {}

            def other() -> None:
                time.sleep(alone_s / 4)
                client.completions.create(model="b", prompt="x", max_tokens=2, temperature=0)
                got["b"] = time.monotonic()

            thread = threading.Thread(target=other)
            thread.start()
            chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
            ended = time.monotonic()
            thread.join()
            after, same_engine = prompt_tokens(f.state("a")["port"]), f.state("a")["port"] == port
        finally:
            f.interrupt()
    log = f.log.read_text()
    assert "a: a stream held after" in log and "held with their KV caches" in log, log[-4000:]
    assert "paused after" not in log, log[-4000:]  # nothing continued from its tokens
    assert re.search(r"switch: a (deep-parked|parked) for b once its requests ended, .*to host memory", log), log
    assert got["b"] < ended, (alone_s, log[-4000:])  # b answered while a's stream was held
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[-1].usage.completion_tokens == 3000
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain  # greedy: token for token
    assert same_engine and after - counted == chunks[-1].usage.prompt_tokens  # its prompt once: nothing again
    engine_log = "".join(p.read_text() for p in tmp_path.glob("logs-*/a.log"))
    assert ("their KV cache in host memory" in engine_log) == (held_kv == "host"), engine_log[-4000:]
