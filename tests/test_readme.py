"""The README's quick start runs as written: its three commands (preload, serve, curl), on a demo model in place of
the checkpoint it names, a free port in place of 8000 and a private keeper; the server maps the weights the preload
published and answers the curl. The first lines still give the two set-up commands (``make demo``, ``make test``).

Run: pytest tests/test_readme.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import run_cli

from ports import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def quick_start() -> list[str]:
    """The commands of the block after the line that begins ``Quick start``, comments cut."""
    block = README.split("\nQuick start", 1)[1].split("```\n", 2)[1]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def until_healthy(proc: subprocess.Popen, port: int, log: Path, timeout_s: float) -> None:
    """Until the server ``proc`` started answers ``/health`` on ``port``; its log when it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


def test_the_first_lines_give_the_two_set_up_commands():
    first = README.split("```", 2)[1]
    assert [line.split()[:2] for line in first.strip().splitlines()] == [["make", "demo"], ["make", "test"]]


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path):
    from hotweights.demo_model import write_demo_model

    preload, serve, curl = quick_start()
    model = str(write_demo_model(tmp_path / "model", "tiny"))
    port = free_port()
    sock = tempfile.mkdtemp(prefix="hwqs-", dir="/tmp")
    env = {**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock}

    def run_line(line: str) -> list[str]:
        args = shlex.split(line.replace("/models/Qwen3-0.6B", model).replace("8000", str(port)))
        assert args[0] in ("hotweights", "curl"), line
        return [sys.executable, "-m", "hotweights", *args[1:]] if args[0] == "hotweights" else args

    try:
        done = subprocess.run(run_line(preload), capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0 and "Published " in done.stdout + done.stderr, done.stderr
        log = tmp_path / "serve.log"
        server = subprocess.Popen(run_line(serve), stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
        try:
            until_healthy(server, port, log, 120)
            assert re.search(r"Mapped \d+ tensors .* from weight cache daemon", log.read_text()), log.read_text()
            args = run_line(curl)  # sent as curl would (a fresh machine may lack curl): its URL, header and body
            url = next(a for a in args if a.startswith(("http", "localhost")))
            header = args[args.index("-H") + 1].split(": ", 1)
            req = urllib.request.Request(url if url.startswith("http") else f"http://{url}",
                                         data=args[args.index("-d") + 1].encode(), headers={header[0]: header[1]})
            with urllib.request.urlopen(req, timeout=60) as r:
                answer = json.loads(r.read())
            assert answer["object"] == "text_completion" and answer["choices"][0]["finish_reason"] in ("length", "stop")
        finally:
            server.terminate()
            server.wait(60)
    finally:
        run_cli("stop", "--socket-dir", sock)


def switch_quick_start() -> tuple[str, list[str]]:
    """The switch's block: the config its heredoc writes, and the commands after it (comments cut)."""
    block = README.split("\nMany models behind one port", 1)[1].split("```\n", 2)[1]
    config = block.split("<<'EOF'", 1)[1].split("\n", 1)[1].split("\nEOF\n", 1)[0]
    after = block.split("\nEOF\n", 1)[1]
    return config, [line.split("  #", 1)[0].strip() for line in after.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_switch_quick_start_runs_as_written_and_status_finds_the_front_without_flags(tmp_path):
    """The README's switch block: its config (tiny demo models for its checkpoints, and a [switch] table with a free
    port and a private keeper: the only lines added), the front, the curl, then ``switch status`` without flags in
    the config's directory (it reads ./switch.toml) and in another (the one front over this keeper, from its note)."""
    from hotweights.demo_model import write_demo_model

    config, (start, curl, status) = switch_quick_start()
    for path in set(re.findall(r'checkpoint = "(/models/[^"]+)"', config)):
        model = write_demo_model(tmp_path / path.rsplit("/", 1)[1], "tiny")
        config = config.replace(f'"{path}"', f'"{model}"')
    port = free_port()
    sock = tempfile.mkdtemp(prefix="hwqs-", dir="/tmp")
    (tmp_path / "switch.toml").write_text(f'[switch]\nport = {port}\nsocket_dir = "{sock}"\n\n{config}\n')
    env = {**os.environ, "HOTWEIGHTS_SOCKET_DIR": sock}

    def hotweights(line: str) -> list[str]:
        args = shlex.split(line)
        assert args[0] == "hotweights", line
        return [sys.executable, "-m", "hotweights", *args[1:]]

    log = tmp_path / "front.log"
    front = subprocess.Popen(hotweights(start), cwd=tmp_path, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             env=env)
    try:
        until_healthy(front, port, log, 180)
        args = shlex.split(curl.replace("8000", str(port)))
        url = next(a for a in args if a.startswith(("http", "localhost")))
        header = args[args.index("-H") + 1].split(": ", 1)
        body = json.loads(args[args.index("-d") + 1])
        req = urllib.request.Request(url if url.startswith("http") else f"http://{url}", data=json.dumps(body).encode(),
                                     headers={header[0]: header[1]})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["model"] == body["model"] and answer["choices"][0]["finish_reason"] in ("length", "stop")
        here = subprocess.run(hotweights(status), cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
        assert here.returncode == 0 and re.search(rf"^{body['model']}\s+awake", here.stdout, re.M), here
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        found = subprocess.run([*hotweights(status), "--json"], cwd=elsewhere, capture_output=True, text=True, env=env,
                               timeout=60)
        assert found.returncode == 0 and {m["name"] for m in json.loads(found.stdout)["models"]} == {"chat", "coder"}
    finally:
        front.terminate()
        front.wait(60)
        run_cli("stop", "--socket-dir", sock)
