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


def test_replace_keeps_the_running_daemons_settings_unless_told(socket_dir):
    from ports import free_port

    sock = str(socket_dir)
    port, port2 = free_port(), free_port()
    started = run_cli("daemon", "--detach", "--socket-dir", sock, "--max-bytes", "100M", "--metrics-port", str(port))
    assert started.returncode == 0, started.stderr
    try:
        wait_running(sock)
        first = status(sock)["pid"]
        assert run_cli("daemon", "--replace", "--detach", "--socket-dir", sock).returncode == 0
        second = wait_running(sock, other_than=first)
        st = status(sock)
        assert st["max_bytes"] == 100 << 20
        assert scrape(port).startswith("# HELP") and "hotweights_budget_bytes 1.048576e+08" in scrape(port)
        log = (socket_dir / "daemon.log").read_text()
        assert (f"kept the running daemon's settings (--max-bytes 104857600, --metrics-port {port}, --metrics-host "
                f"127.0.0.1); changed: none") in log
        # what the command line gives wins, and is named
        assert run_cli("daemon", "--replace", "--detach", "--socket-dir", sock, "--max-bytes", "0",
                       "--metrics-port", str(port2)).returncode == 0
        wait_running(sock, other_than=second)
        assert status(sock)["max_bytes"] == 0 and "hotweights_budget_bytes 0.0" in scrape(port2)
        assert (f"changed: --max-bytes 104857600 -> 0, --metrics-port {port} -> {port2}"
                in (socket_dir / "daemon.log").read_text())
    finally:
        run_cli("stop", "--socket-dir", sock)


def wait_running(sock: str, other_than: int = 0) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = status(sock)
        if st.get("running") and st["pid"] != other_than:
            return st["pid"]
        time.sleep(0.05)
    raise AssertionError(f"no daemon other than pid {other_than} answered: {status(sock)}")


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_a_keeper_under_init_is_upgraded_in_place_by_replace_and_init_stops_with_it(models, socket_dir, tmp_path):
    """``daemon --init`` as a pod's PID 1 (here a child subreaper): ``daemon --replace --detach`` (what ``kubectl
    exec`` runs) hands the entries to a new keeper, the old one exits, init stays; SIGTERM to init reaches the
    keeper holding the lock, and init exits once none does."""
    import os
    import signal

    sock = str(socket_dir)
    log = open(tmp_path / "init.log", "wb")
    init = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--init", "--socket-dir", sock],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not status(sock).get("pid"):
            assert init.poll() is None and time.monotonic() < deadline, (tmp_path / "init.log").read_text()
            time.sleep(0.1)
        first = status(sock)["pid"]
        key = preload(models["tiny"], socket_dir=sock).key
        assert run_cli("daemon", "--replace", "--detach", "--socket-dir", sock).returncode == 0
        while status(sock).get("pid") in (first, None):
            assert time.monotonic() < deadline + 30, (tmp_path / "init.log").read_text()
            time.sleep(0.1)
        time.sleep(1.0)
        now = status(sock)
        assert [e["key"] for e in now["entries"]] == [key.short]  # the cache went on, in the new keeper
        assert init.poll() is None  # the container's main process outlived the old keeper
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # gone and reaped by init
        assert attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False)).ok
        init.send_signal(signal.SIGTERM)
        assert init.wait(30) == 0
        assert run_cli("status", "--socket-dir", sock).returncode != 0  # the keeper stopped with it
        text = (tmp_path / "init.log").read_text()
        assert f"init: pid {first} exited (code 0)" in text and "init: no keeper holds" in text
    finally:
        if init.poll() is None:
            init.kill()
        run_cli("stop", "--socket-dir", sock)
        log.close()
