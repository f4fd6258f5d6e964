"""``hotweights daemon --replace``: the cache outlives its daemon. A new daemon takes every entry (the
same pool memory, fds passed) and the socket; the old one exits; attaches go on meanwhile, all ok.

Run: pytest tests/test_handover.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import DaemonProc, run_cli

from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.preload import preload

pytestmark = pytest.mark.slow  # daemons in subprocesses


def status(sock: str) -> dict:
    return json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)


def test_replace_keeps_every_entry_and_attaches_never_miss(models, socket_dir, tmp_path):
    old = DaemonProc(socket_dir)
    sock = str(socket_dir)
    keys = [preload(models[size], socket_dir=sock).key for size in ("tiny", "small")]
    before = {k.short: attach_tensors(k, AttachConfig(socket_dir=sock, fallback=False)).tensors for k in keys}
    outcomes: list[str] = []
    waits: list[float] = []
    stop = threading.Event()

    def attach_meanwhile() -> None:
        while not stop.is_set():
            t = time.monotonic()
            outcomes.append(attach_tensors(keys[1], AttachConfig(socket_dir=sock, fallback=False)).outcome.value)
            waits.append(time.monotonic() - t)

    worker = threading.Thread(target=attach_meanwhile)
    worker.start()
    log = open(tmp_path / "new.log", "wb")
    new = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--replace", "--socket-dir", sock],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        assert old.proc.wait(30) == 0  # the old daemon stopped when asked
        deadline = time.monotonic() + 30
        while status(sock).get("pid") != new.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        stop.set()
        worker.join()
        now = status(sock)
        assert now["pid"] == new.pid and sorted(e["key"] for e in now["entries"]) == sorted(before)
        assert set(outcomes) == {"ok"} and len(outcomes) > 3, outcomes  # no absent, no refused connection
        for k in keys:
            after = attach_tensors(k, AttachConfig(socket_dir=sock, fallback=False)).tensors
            assert all(torch.equal(after[n], t) for n, t in before[k.short].items())
        text = (tmp_path / "new.log").read_text()
        assert "hand-off: took 2 entries from pid" in text and "Weight cache daemon READY" in text
        print(f"hand-off: {len(outcomes)} attaches meanwhile, slowest {max(waits) * 1e3:.1f} ms")
    finally:
        stop.set()
        new.terminate()
        new.wait(10)
        old.stop()
        log.close()


def test_replace_with_no_daemon_running_just_starts_one(socket_dir, tmp_path):
    with open(tmp_path / "d.log", "wb") as log:
        new = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--replace", "--socket-dir",
                                str(socket_dir)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while not status(str(socket_dir)).get("running") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert status(str(socket_dir))["pid"] == new.pid
            assert "no daemon was running; started afresh" in (tmp_path / "d.log").read_text()
        finally:
            new.terminate()
            new.wait(10)
