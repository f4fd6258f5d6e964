"""Embedded server, started for real: disk, warm and warm-restart answers are identical.

Run: pytest tests/test_serve.py
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from conftest import ServerProc, run_cli

pytestmark = pytest.mark.slow  # real server processes; `make test-fast` skips them

PROMPT = {"prompt": "The weight cache", "max_tokens": 12, "temperature": 0}


def strict(sock) -> str:
    return json.dumps({"socket_dir": str(sock), "fallback": False})


def test_disk_warm_and_warm_restart_answer_identically(models, daemon, tmp_path):
    sock = daemon.paths.directory
    disk = ServerProc(models["small"], tmp_path / "disk.log", "--load-format", "auto")
    try:
        assert disk.ready, disk.log()
        status, base = disk.post("/v1/completions", PROMPT)
        assert status == 200 and base["choices"][0]["finish_reason"] == "length"
        assert base["usage"]["completion_tokens"] == 12
    finally:
        disk.stop()
    assert "Mapped" not in disk.log() and "source=disk" in disk.log()
    assert run_cli("preload", "--model", str(models["small"]), "--socket-dir", str(sock)).returncode == 0
    texts = [base["choices"][0]["text"]]
    for label in ("warm1", "warm2"):
        server = ServerProc(models["small"], tmp_path / f"{label}.log", "--model-loader-extra-config", strict(sock))
        try:
            assert server.ready, server.log()
            status, body = server.post("/v1/completions", PROMPT)
            assert status == 200
            texts.append(body["choices"][0]["text"])
        finally:
            server.stop()
        log = server.log()
        assert "Mapped 47 tensors (0.01 GiB) from weight cache daemon" in log and "falling back" not in log
        line = next(x for x in log.splitlines() if "startup: imports=" in x)
        for phase in ("cuda_context=", "tokenizer=", "model_build=", "weights=", "(source=cache)", "warmup=",
                      "listening=", "ready=", "(from process start)"):
            assert phase in line, line
    assert texts[0] == texts[1] == texts[2]


def test_models_and_health(warm_server):
    with urllib.request.urlopen(warm_server.url + "/v1/models") as r:
        data = json.loads(r.read())
    assert data["data"][0]["id"] == "tiny" and data["data"][0]["max_model_len"] == 64


def test_streaming_matches_non_streaming(warm_server):
    body = {"prompt": "Hello", "max_tokens": 10, "temperature": 0}
    _, whole = warm_server.post("/v1/completions", body)
    data = json.dumps({**body, "stream": True}).encode()
    req = urllib.request.Request(warm_server.url + "/v1/completions", data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_max_completion_tokens_is_honoured_and_each_request_gets_an_access_log_line(warm_server):
    _, data = warm_server.post("/v1/completions", {"prompt": "Hello", "max_completion_tokens": 3, "max_tokens": 16,
                                                   "temperature": 0})
    assert data["usage"]["completion_tokens"] == 3
    deadline = time.monotonic() + 10
    while '"POST /v1/completions HTTP/1.1" 200' not in warm_server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"POST /v1/completions HTTP/1.1" 200' in warm_server.log()  # uvicorn's line, as vLLM's server writes


def test_the_first_streamed_chat_chunk_names_the_role(warm_server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "stream": True}
    req = urllib.request.Request(warm_server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in e["choices"][0]["delta"] for e in events[1:])


def test_chat_uses_the_template_and_is_deterministic(warm_server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    s1, a = warm_server.post("/v1/chat/completions", body)
    s2, b = warm_server.post("/v1/chat/completions", body)
    assert s1 == s2 == 200 and a["object"] == "chat.completion"
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # 3 special tokens, the rest 1 byte each
    assert a["usage"]["prompt_tokens"] == len(text) - 2 * len("<|im_start|>") - len("<|im_end|>") + 3


def test_a_chat_completion_without_a_limit_may_use_the_rest_of_the_context(warm_server):
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    status, reply = warm_server.post("/v1/chat/completions", body)
    room = 64 - reply["usage"]["prompt_tokens"]  # the server runs with --max-model-len 64
    assert status == 200 and reply["usage"]["completion_tokens"] > 16, reply
    assert reply["choices"][0]["finish_reason"] == "stop" or reply["usage"]["completion_tokens"] == room


def test_seeded_sampling_is_reproducible(warm_server):
    body = {"prompt": "abc", "max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    first, again = (warm_server.post("/v1/completions", body)[1]["choices"] for _ in range(2))
    assert first == again


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "max_tokens": 100}, "max_tokens"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),  # more than vLLM's default limit
    ({"prompt": "x", "logprobs": 1, "echo": True}, "logprobs"),  # the prompt's logprobs: not served
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "min_p": 0.1}, "min_p"),  # unknown here: refused, naming it
])
def test_bad_requests_get_400_with_an_openai_error(warm_server, body, param):
    status, data = warm_server.post("/v1/completions", body)
    assert status == 400
    assert data["error"]["type"] == "BadRequestError" and data["error"]["param"] == param
    assert data["error"]["code"] == 400  # vLLM's shape: the status as the code


def test_a_body_that_is_not_json_gets_400_naming_it(warm_server):
    status, data = warm_server.post("/v1/chat/completions", b'{"messages": [')
    assert status == 400 and data["error"]["type"] == "BadRequestError"
    assert data["error"]["message"].startswith("invalid request: Invalid JSON") and data["error"]["param"] is None


def test_stop_string_ends_the_completion(warm_server):
    _, whole = warm_server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 10, "temperature": 0})
    text = whole["choices"][0]["text"]
    printable = [c for c in text[1:] if c != "\ufffd"]
    assert printable, f"the demo model's greedy text {text!r} has no character to stop on"
    stop = printable[0]
    _, cut = warm_server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 10, "temperature": 0,
                                                  "stop": stop})
    assert cut["choices"][0]["text"] == text[:text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_strict_start_without_daemon_fails_fast(models, socket_dir, tmp_path):
    start = time.monotonic()
    server = ServerProc(models["tiny"], tmp_path / "strict.log", "--model-loader-extra-config", strict(socket_dir))
    code = server.proc.wait(60)
    elapsed = time.monotonic() - start
    server.stop()
    assert not server.ready and code != 0
    assert (f"Weight cache unusable (daemon unavailable: no daemon socket at {socket_dir}/daemon.sock) and fallback "
            f"is disabled") in server.log()
    assert elapsed < 30, elapsed


def test_dtype_mismatch_is_reported_and_fallback_still_serves(models, daemon, tmp_path):
    sock = str(daemon.paths.directory)
    preloaded = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float16", "--socket-dir", sock)
    assert preloaded.returncode == 0, preloaded.stderr
    server = ServerProc(models["tiny"], tmp_path / "mm.log", "--dtype", "bfloat16",
                        "--model-loader-extra-config", json.dumps({"socket_dir": sock}))
    try:
        assert server.ready, server.log()
    finally:
        server.stop()
    log = server.log()
    assert "Weight cache unusable (cached entry tiny [" in log
    assert "dtype: cached=float16 requested=bfloat16); falling back to disk loading" in log
