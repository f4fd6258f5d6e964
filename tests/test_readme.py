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
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        break
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
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
