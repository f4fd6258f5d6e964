"""Crash survival through a service manager's fd store (``keeper/fdstore.py``), without systemd: the
test plays the service manager (a notify socket that keeps the fds it is given by name, forgets them on
FDSTOREREMOVE, and restarts the daemon with them as systemd does: fds from 3, ``LISTEN_PID``,
``LISTEN_FDS``, ``LISTEN_FDNAMES``). The unit files are checked with ``systemd-analyze verify``.

Run: pytest tests/test_fdstore.py
"""

from __future__ import annotations

import array
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.preload import preload

pytestmark = pytest.mark.slow  # daemons in subprocesses
ROOT = Path(__file__).resolve().parents[1]
# exec the daemon with the stored fds at 3, 4, ... and LISTEN_PID set to its own pid, as systemd does
EXEC = ("import fcntl, os, sys; fds = [int(x) for x in sys.argv[1].split(',') if x]\n"
        "high = [fcntl.fcntl(f, fcntl.F_DUPFD, 1000) for f in fds]  # out of the way of 3, 4, ...\n"
        "for i, f in enumerate(high): os.dup2(f, 3 + i)  # inheritable\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)))\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'hotweights', 'daemon', *sys.argv[2:]])")


class ServiceManager:
    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.store: dict[str, int] = {}
        self.messages: list[str] = []
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        self.proc: subprocess.Popen | None = None

    def _listen(self) -> None:
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
            except OSError:
                return
            fds = array.array("i")
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(data.decode())
            if fields.get("FDSTORE") == "1":
                self.store[fields["FDNAME"]] = fds[0]
            if fields.get("FDSTOREREMOVE") == "1" and fields["FDNAME"] in self.store:
                os.close(self.store.pop(fields["FDNAME"]))
            if fields.get("READY") == "1":
                self.ready.set()

    def start(self, socket_dir: Path, log: Path) -> None:
        self.ready.clear()
        names = list(self.store)
        env = {**os.environ, "NOTIFY_SOCKET": self.path, "LISTEN_FDNAMES": ":".join(names)}
        fds = [self.store[n] for n in names]
        self.proc = subprocess.Popen([sys.executable, "-c", EXEC, ",".join(map(str, fds)), "--socket-dir",
                                      str(socket_dir)], env=env, pass_fds=fds, stdout=open(log, "ab"),
                                     stderr=subprocess.STDOUT)
        assert self.ready.wait(30), log.read_text()

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.sock.close()
        for fd in self.store.values():
            os.close(fd)


def test_a_daemon_killed_with_sigkill_comes_back_with_every_entry(models, socket_dir, tmp_path):
    manager = ServiceManager(tmp_path)
    log = tmp_path / "daemon.log"
    sock = str(socket_dir)
    try:
        manager.start(socket_dir, log)
        keys = [preload(models[size], socket_dir=sock).key for size in ("tiny", "small")]
        before = {k.short: attach_tensors(k, AttachConfig(socket_dir=sock, fallback=False)).tensors for k in keys}
        assert sorted(n for n in manager.store if n.endswith(".m")) == sorted(f"hw.{k.short}.m" for k in keys)
        assert run_cli("release", keys[0].short, "--socket-dir", sock).returncode == 0
        assert not any(n.startswith(f"hw.{keys[0].short}.") for n in manager.store)  # forgotten on release
        manager.proc.send_signal(signal.SIGKILL)
        manager.proc.wait(10)
        start = time.monotonic()
        manager.start(socket_dir, log)  # the restart: the stored fds passed back
        restart_s = time.monotonic() - start
        entries = json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)["entries"]
        assert [e["key"] for e in entries] == [keys[1].short]
        after = attach_tensors(keys[1], AttachConfig(socket_dir=sock, fallback=False)).tensors
        assert all(torch.equal(after[n], t) for n, t in before[keys[1].short].items())
        text = log.read_text()
        assert f"fd store: entry {keys[1].short} (small): restored from the service manager's store" in text
        print(f"restart with the stored entry, to READY: {restart_s:.2f} s")
    finally:
        manager.close()


def test_without_a_service_manager_nothing_is_sent_and_nothing_breaks(models, daemon):
    sock = str(daemon.paths.directory)
    preload(models["tiny"], socket_dir=sock)
    assert "fd store" not in daemon.log() and "READY" in daemon.log()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_files_pass_systemd_analyze_verify(tmp_path):
    units = sorted((ROOT / "deploy" / "systemd").rglob("*.service"))
    assert len(units) == 3  # the keeper as a user and as a system unit, the switch as a user unit
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)  # a user manager's runtime directory, which --user needs
    for unit in units:
        user = "user" in unit.relative_to(ROOT).parts
        r = subprocess.run(["systemd-analyze", "verify", *(["--user"] if user else []), str(unit)],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_replace_under_a_service_manager_restarts_the_unit_with_its_entries(models, socket_dir, tmp_path):
    # a --replace run from a shell must not start a daemon outside the unit (and its fd store): it asks the
    # running daemon to exit for a restart, and the manager (Restart=on-failure / RestartForceExitStatus=75)
    # starts the installed hotweights with the stored entries
    manager = ServiceManager(tmp_path)
    log = tmp_path / "daemon.log"
    sock = str(socket_dir)
    try:
        manager.start(socket_dir, log)
        key = preload(models["small"], socket_dir=sock).key
        before = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False)).tensors
        old_pid = manager.proc.pid
        replacer = subprocess.Popen([sys.executable, "-m", "hotweights", "daemon", "--replace", "--socket-dir", sock],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert manager.proc.wait(20) == 75  # EX_TEMPFAIL: to be restarted, entries left in the store
        manager.start(socket_dir, log)  # what systemd does on that exit status
        out, err = replacer.communicate(timeout=60)
        assert replacer.returncode == 0, err
        assert f"the service manager restarted the daemon (pid {old_pid} -> {manager.proc.pid}" in out
        assert "with 1 of 1 entries from its fd store" in out
        after = attach_tensors(key, AttachConfig(socket_dir=sock, fallback=False)).tensors
        assert all(torch.equal(after[n], t) for n, t in before.items())
    finally:
        manager.close()


def test_a_restart_request_without_a_service_manager_is_refused(models, daemon):
    from hotweights.client import connect
    from hotweights.errors import ProtocolError

    with connect(daemon.paths) as client, pytest.raises(ProtocolError, match="only under a service manager"):
        client.stop(restart=True)
    assert daemon.proc.poll() is None
