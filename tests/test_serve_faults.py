"""The embedded server under the faults clients cause: a client that drops a stream or a plain request,
signals while a generation runs. A real server in a subprocess, real sockets.

Each generation here is made long on purpose: the eos token is biased away, so the small demo model
generates until its limit (thousands of tokens, tens of seconds on a CPU) unless it is cancelled.

Run: pytest tests/test_serve_faults.py
"""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest
from conftest import ServerProc

pytestmark = pytest.mark.slow  # real server processes

LONG = {"prompt": "Hi", "temperature": 0, "logit_bias": {"258": -100}}  # no eos: runs to max_model_len


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    s = ServerProc(models["small"], tmp_path_factory.mktemp("faults") / "s.log", "--load-format", "auto",
                   "--max-model-len", "4096")
    assert s.ready, s.log()
    yield s
    s.stop()


def raw_post(server: ServerProc, path: str, body: dict) -> socket.socket:
    """A request sent on a socket that the test can drop at will."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        data = sock.recv(65536)
        assert data, f"the server closed the connection before {marker!r}: {got[:300]!r}"
        got += data
    return got


def timed(server: ServerProc, body: dict) -> tuple[float, int, dict]:
    start = time.monotonic()
    status, answer = server.post("/v1/completions", body)
    return time.monotonic() - start, status, answer


def test_a_dropped_stream_frees_the_server(server):
    sock = raw_post(server, "/v1/completions", {**LONG, "max_tokens": 3000, "stream": True})
    read_until(sock, b"data: ")  # streaming has begun
    sock.close()  # the client gives up
    seconds, status, answer = timed(server, {"prompt": "Hi", "max_tokens": 1, "temperature": 0})
    assert status == 200 and answer["usage"]["completion_tokens"] == 1
    assert seconds < 10, f"a 1-token request took {seconds:.1f} s after a dropped stream"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in s.recv(4096).split(b"\r\n")[0] + b" "


def test_a_dropped_plain_request_is_cancelled(server):
    sock = raw_post(server, "/v1/chat/completions", {**{k: v for k, v in LONG.items() if k != "prompt"},
                                                    "messages": [{"role": "user", "content": "Hi"}]})
    time.sleep(1.0)  # generating, no max_tokens: the rest of a 4096-token context
    sock.close()
    seconds, status, _ = timed(server, {"prompt": "Hi", "max_tokens": 1, "temperature": 0})
    assert status == 200 and seconds < 10, f"{seconds:.1f} s: the abandoned request kept the engine"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_server_during_a_generation(models, tmp_path, signum):
    s = ServerProc(models["small"], tmp_path / "s.log", "--load-format", "auto", "--max-model-len", "4096")
    try:
        assert s.ready, s.log()
        reader = raw_post(s, "/v1/completions", {**LONG, "max_tokens": 4000, "stream": True})
        read_until(reader, b"data: ")  # a client that reads on, slowly
        sleeper = raw_post(s, "/v1/completions", {**LONG, "max_tokens": 4000})  # and one that waits
        time.sleep(0.5)
        start = time.monotonic()
        s.proc.send_signal(signum)
        code = s.proc.wait(20)
        seconds = time.monotonic() - start
        assert seconds < 8, f"the server took {seconds:.1f} s to stop after signal {signum}"
        # uvicorn re-raises the signal once it has shut down: SIGTERM ends the process by that signal, SIGINT
        # reaches the CLI as KeyboardInterrupt (130, the shell's code for an interrupted command)
        assert code in (-signum, 128 + signum), s.log()
        reader.close()
        sleeper.close()
    finally:
        s.stop()
