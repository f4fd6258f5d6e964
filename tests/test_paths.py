"""Socket directory: the lookup order and the trust checks, as the daemon and clients apply them.

Run: pytest tests/test_paths.py
"""

from __future__ import annotations

import os

import pytest
from conftest import run_cli


@pytest.mark.parametrize("mode, message", [(0o777, "group/world accessible (mode 0777)"), ("link", "is a symlink")])
def test_untrusted_socket_dir_is_refused(socket_dir, mode, message):
    target = socket_dir / "d"
    if mode == "link":
        (socket_dir / "real").mkdir(mode=0o700)
        target.symlink_to(socket_dir / "real")
    else:
        target.mkdir()
        os.chmod(target, mode)
    result = run_cli("daemon", "--socket-dir", str(target))
    assert result.returncode == 1 and message in result.stderr


NOBODY = 65534


# a stand-in daemon run by another uid: it answers nothing and records every byte it gets
IMPOSTOR = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1] + "/daemon.sock")
os.chmod(sys.argv[1] + "/daemon.sock", 0o777)
sock.listen(16)
while True:
    conn, _ = sock.accept()
    conn.settimeout(1)
    try:
        data, anc, _, _ = conn.recvmsg(4096, 4096)
    except OSError:
        data, anc = b"", []
    with open(sys.argv[1] + "/received", "ab") as f:
        f.write(b"%d bytes %d ancillary\\n" % (len(data), len(anc)))
    conn.close()
"""


@pytest.fixture
def impostor():
    """Another uid's process listening at daemon.sock in a directory it owns, opened up 0755."""
    import shutil
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    from hotweights.paths import DaemonPaths

    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or not system_python:
        pytest.skip("needs root and a system python3 to run a process as another uid")
    directory = Path(tempfile.mkdtemp(prefix="hw-imp-", dir="/tmp"))
    os.chown(directory, NOBODY, NOBODY)
    os.chmod(directory, 0o755)
    proc = subprocess.Popen([system_python, "-c", IMPOSTOR, str(directory)], user=NOBODY, group=NOBODY,
                            extra_groups=[], cwd="/")
    paths = DaemonPaths(directory)
    deadline = time.monotonic() + 10
    while not paths.socket.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "impostor did not start"
        time.sleep(0.02)
    yield paths, proc
    proc.kill()
    proc.wait(10)
    shutil.rmtree(directory, ignore_errors=True)


def test_clients_refuse_a_socket_dir_of_another_user_before_sending_anything(impostor, models):
    from hotweights.client import connect
    from hotweights.config import AttachConfig
    from hotweights.errors import TrustError
    from hotweights.loading.attach import attach_tensors
    from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint

    paths, _ = impostor
    with pytest.raises(TrustError, match=f"socket dir {paths.directory} is owned by uid {NOBODY}, not 0: another "
                                         f"user made it"):
        connect(paths)
    key = checkpoint_key(open_checkpoint(models["tiny"]), dtype="float16")
    result = attach_tensors(key, AttachConfig(socket_dir=str(paths.directory)))
    assert result.outcome == "absent" and result.reason.startswith("untrusted daemon: socket dir")
    for args in (["preload", "--model", str(models["tiny"]), "--dtype", "float16"], ["status"], ["stop"],
                 ["release", "--all"]):
        r = run_cli(*args, "--socket-dir", str(paths.directory))
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and f"is owned by uid {NOBODY}" in r.stderr, (args, r.stderr)
    assert not (paths.directory / "received").exists()  # the impostor never got a byte or an fd


def test_clients_refuse_a_daemon_of_another_uid_behind_a_trusted_dir(impostor, socket_dir, models):
    """The directory checks pass (ours, 0700), but the socket is the impostor's: SO_PEERCRED says so."""
    from hotweights.client import connect
    from hotweights.errors import TrustError
    from hotweights.paths import DaemonPaths

    paths, proc = impostor
    os.link(paths.socket, socket_dir / "daemon.sock")  # root may link another user's socket
    with pytest.raises(TrustError, match=rf"the daemon at {socket_dir}/daemon.sock \(pid {proc.pid}\) runs as "
                                         rf"uid {NOBODY}, not as you \(uid 0\)"):
        connect(DaemonPaths(socket_dir))
    r = run_cli("preload", "--model", str(models["tiny"]), "--dtype", "float16", "--socket-dir", str(socket_dir))
    assert r.returncode == 1 and f"runs as uid {NOBODY}" in r.stderr and "Traceback" not in r.stderr
    received = (paths.directory / "received").read_text()
    assert set(received.splitlines()) == {"0 bytes 0 ancillary"}  # connected, then nothing was sent


def test_a_large_daemon_log_is_rotated_once_and_a_small_one_kept(tmp_path):
    from hotweights.paths import rotate_log

    log = tmp_path / "daemon.log"
    rotate_log(log)  # none yet: nothing to do
    log.write_bytes(b"x" * 100)
    rotate_log(log, keep_bytes=1000)
    assert log.read_bytes() == b"x" * 100 and not (tmp_path / "daemon.log.1").exists()
    rotate_log(log, keep_bytes=10)
    assert not log.exists() and (tmp_path / "daemon.log.1").read_bytes() == b"x" * 100
