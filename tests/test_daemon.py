"""The keeper daemon, run for real in a subprocess: trust rules, lifecycle, hostile input.

Property: the daemon never dies on a request, never leaks an fd, never imports torch.
Run: pytest tests/test_daemon.py
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import signal
import socket
import stat
import struct
import time

import msgpack
import pytest
from conftest import DaemonProc, run_cli

from hotweights import evidence
from hotweights.client import Outcome, connect, wait_for_daemon
from hotweights.errors import ProtocolError
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack
from hotweights.paths import DaemonPaths
from hotweights.protocol import Publish, encode, recv_message
from hotweights.wire import send_frame

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m")


def raw(daemon: DaemonProc) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    for _ in range(1000):  # a full listen backlog answers EAGAIN at once
        try:
            s.connect(str(daemon.paths.socket))
            return s
        except BlockingIOError:
            time.sleep(0.005)
    raise TimeoutError("listen backlog stayed full")


def sealed_memfd(nbytes: int, *, seal: bool = True) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def resting_fds(daemon: DaemonProc) -> int:
    """The daemon's fd count once connection threads from earlier requests have closed."""
    last, deadline = -1, time.monotonic() + 3
    while time.monotonic() < deadline:
        now = daemon.num_fds()
        if now == last:
            return now
        last = now
        time.sleep(0.2)
    return last


def settle_fds(daemon: DaemonProc, expected: int) -> int:
    deadline = time.monotonic() + 3
    while daemon.num_fds() != expected and time.monotonic() < deadline:
        time.sleep(0.02)  # connection threads close their sockets asynchronously
    return daemon.num_fds()


def test_ready_line_and_private_permissions(daemon):
    assert evidence.daemon_ready(str(daemon.paths.socket), daemon.pid) in daemon.log()
    assert stat.S_IMODE(os.stat(daemon.paths.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(daemon.paths.socket).st_mode) == 0o600


def test_daemon_never_imports_torch_or_cuda(daemon):
    with connect(daemon.paths) as c:
        assert c.status().torch_imported is False
    maps = open(f"/proc/{daemon.pid}/maps").read()
    assert "libtorch" not in maps and "libcuda" not in maps


def test_a_detached_daemon_does_not_hold_its_callers_output_open(socket_dir):
    # `hotweights daemon --detach | tail -1` and `$(...)` return once the caller is done
    r = run_cli("daemon", "--detach", "--socket-dir", str(socket_dir), timeout=10)
    assert r.returncode == 0 and f"its log: {socket_dir}/daemon.log" in r.stdout
    try:
        with wait_for_daemon(DaemonPaths(socket_dir), state_timeout_s=15) as c:
            assert c.hello().pid > 0
        assert evidence.READY_MARK in (socket_dir / "daemon.log").read_text()
    finally:
        assert run_cli("stop", "--socket-dir", str(socket_dir)).returncode == 0


def test_stop_is_done_when_it_returns_and_stopping_nothing_is_no_error(socket_dir):
    d = DaemonProc(socket_dir)
    assert run_cli("stop", "--socket-dir", str(socket_dir)).returncode == 0
    assert not d.paths.socket.exists()
    again = run_cli("stop", "--socket-dir", str(socket_dir))
    assert again.returncode == 0 and again.stdout.startswith("no daemon running (no daemon socket at")
    d.proc.wait(10)


def test_release_takes_a_unique_prefix_and_names_a_key_it_does_not_know(models, daemon):
    sock = str(daemon.paths.directory)
    key = json.loads(run_cli("preload", "--model", str(models["tiny"]), "--json", "--socket-dir", sock).stdout)["key"]
    unknown = run_cli("release", "ffffffff", "--socket-dir", sock)
    assert unknown.returncode == 1
    assert unknown.stdout.strip() == "no entry with key ffffffff (hotweights status lists them)"
    done = run_cli("release", key[:6], "--socket-dir", sock)
    assert done.returncode == 0 and done.stdout.strip() == f"released 1 entry: {key}"
    said = [line for line in daemon.log().splitlines() if "released: keys=" in line]  # the daemon names the model
    assert len(said) == 1 and said[0].endswith(f"models={models['tiny'].name}[{key}]"), daemon.log()[-2000:]


def test_second_daemon_is_refused(daemon):
    result = run_cli("daemon", "--socket-dir", str(daemon.paths.directory))
    assert result.returncode == 3
    assert f"another weight cache daemon (pid {daemon.pid}) already serves" in result.stderr
    with connect(daemon.paths) as c:
        assert c.hello().pid == daemon.pid


def test_stale_socket_is_recovered(socket_dir):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_dir / "daemon.sock"))
    stale.close()  # the file stays: what a crashed daemon leaves behind
    d = DaemonProc(socket_dir)
    try:
        assert "removing stale socket" in d.log()
    finally:
        assert d.stop() == 0


def test_sigterm_shuts_down_cleanly(daemon):
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(10) == 0
    assert not daemon.paths.socket.exists()
    assert "Weight cache daemon stopped" in daemon.log()


def test_hostile_frames_get_errors_and_the_daemon_keeps_serving(daemon):
    baseline = resting_fds(daemon)
    replies = []
    cases = [
        msgpack.packb({"op": "format_disk"}),
        msgpack.packb({"op": "hello", "version": "1"}),
        msgpack.packb({"op": "attach", "key": {"x": 1}, }),
        msgpack.packb({"op": "hello_ok", "version": 1, "daemon_version": "x", "pid": 1}),
        msgpack.packb({"op": "hello", "version": 99}),
        b"\xc1\xc1",
    ]
    with raw(daemon) as s:
        for payload in cases:
            send_frame(s, payload)
            replies.append(recv_message(s)[0])
    assert [r.code for r in replies] == ["unknown_op", "bad_message", "bad_message", "bad_message", "version",
                                         "bad_frame"]
    with raw(daemon) as s:  # oversized length: error reply, then the connection is closed
        s.sendall(struct.pack(">I", 1 << 31))
        assert recv_message(s)[0].code == "frame_too_large"
        assert s.recv(1) == b""
    with raw(daemon) as s:  # truncated frame with fds attached
        r, w = os.pipe()
        s.sendmsg([struct.pack(">I", 50) + b"abc"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("ii", r, w))])
        os.close(r)
        os.close(w)
    with raw(daemon) as s:  # fds on an op that takes none
        r, w = os.pipe()
        send_frame(s, encode_hello(), [r, w])
        os.close(r)
        os.close(w)
        assert recv_message(s)[0].code == "bad_message"
    with connect(daemon.paths) as c:
        assert c.status().entries == []
    assert settle_fds(daemon, baseline) == baseline


def encode_hello() -> bytes:
    return msgpack.packb({"op": "hello", "version": 1})


@pytest.mark.parametrize("problem, message", [
    ("count", "manifest names 1 pools but 2 fds came with it"),
    ("size", "fd is not a memfd of 1024 bytes (/memfd:t (deleted), size 256)"),
    ("unsealed", "memfd is not sealed against write/shrink/grow"),
])
def test_liar_publish_is_rejected_without_leaking(daemon, problem, message):
    baseline = resting_fds(daemon)
    pools, specs = pack([("w", "float16", (512,))], pool_bytes=1024, device="cpu")
    manifest = Manifest(KEY, pools, specs)
    fds = {"count": [sealed_memfd(1024), sealed_memfd(1024)], "size": [sealed_memfd(256)],
           "unsealed": [sealed_memfd(1024, seal=False)]}[problem]
    try:
        with connect(daemon.paths) as c, pytest.raises(ProtocolError) as err:
            c.publish(manifest, fds)
        assert message in str(err.value) and err.value.code == "bad_manifest"
    finally:
        for fd in fds:
            os.close(fd)
    with connect(daemon.paths) as c:
        assert c.status().entries == []
    assert settle_fds(daemon, baseline) == baseline
    assert "publish rejected" in daemon.log()


def test_manifest_beyond_its_pool_is_rejected(daemon):
    pools, specs = pack([("w", "float16", (512,))], pool_bytes=1024, device="cpu")
    wire = Manifest(KEY, pools, specs).to_wire()
    wire["tensors"][0][5] = 512  # offset: now ends at 1536 in a 1024-byte pool
    body = msgpack.unpackb(encode(Publish(Manifest(KEY, pools, specs))))
    body["manifest"] = wire
    fd = sealed_memfd(1024)
    with raw(daemon) as s:
        send_frame(s, msgpack.packb(body), [fd])
        reply = recv_message(s)[0]
    os.close(fd)
    assert reply.code == "bad_message" and "tensor 'w': bytes 512..1536 exceed pool 0 of 1024 bytes" in reply.message


def test_publish_attach_release_and_memory_lifetime(daemon):
    pools, specs = pack([("w", "float16", (512,))], pool_bytes=1024, device="cpu")
    fd = sealed_memfd(1024)
    with connect(daemon.paths) as c:
        assert c.publish(Manifest(KEY, pools, specs), [fd]).key_short == KEY.short
        os.close(fd)
        with pytest.raises(ProtocolError, match="already published"):
            fd2 = sealed_memfd(1024)
            try:
                c.publish(Manifest(KEY, pools, specs), [fd2])
            finally:
                os.close(fd2)
        reply = c.attach(KEY)
        fds = reply.take_fds()
        assert reply.answer().manifest.key == KEY and len(fds) == 1
        held = mmap.mmap(fds[0], 1024, mmap.MAP_PRIVATE, mmap.PROT_READ)
        os.close(fds[0])
        assert c.release(KEY.short).released == [KEY.short]
        reply = c.attach(KEY)
        assert reply.pools == [] and reply.answer().outcome is Outcome.MISS
    assert held[:4] == b"\0\0\0\0"  # the mapping outlives the release
    held.close()


def test_budget_refuses_oversized_publish(socket_dir):
    d = DaemonProc(socket_dir, "--max-bytes", "512")
    try:
        pools, specs = pack([("w", "float16", (512,))], pool_bytes=1024, device="cpu")
        fd = sealed_memfd(1024)
        with connect(d.paths) as c, pytest.raises(ProtocolError, match="exceed the daemon budget of 512") as err:
            c.publish(Manifest(KEY, pools, specs), [fd])
        os.close(fd)
        assert err.value.code == "budget"
    finally:
        d.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to another uid")
def test_client_of_another_uid_is_rejected(daemon):
    os.chmod(daemon.paths.directory, 0o711)  # let uid 65534 reach the socket: the uid check must stop it
    os.chmod(daemon.paths.socket, 0o666)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only raw syscalls, then _exit
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(str(daemon.paths.socket))
            send_frame(s, encode_hello())
            os.write(w, encode(recv_message(s)[0]))
        except BaseException as exc:  # report, never return into pytest
            os.write(w, repr(exc).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    answer = os.read(r, 4096)
    os.close(r)
    os.chmod(daemon.paths.directory, 0o700)
    try:
        reply = msgpack.unpackb(answer)
    except (ValueError, msgpack.UnpackException):
        raise AssertionError(f"the other-uid client reported: {answer!r}") from None
    assert reply["op"] == "error" and reply["code"] == "forbidden", answer
    assert "connection rejected: peer_uid=65534" in daemon.log()


# -- what one client can cost (issue 11) ---------------------------------------------------


def publish_one(daemon: DaemonProc) -> bytes:
    """Publish KEY with known bytes; returns them."""
    data = bytes(range(256)) * 4
    pools, specs = pack([("w", "float16", (512,))], pool_bytes=1024, device="cpu")
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.pwrite(fd, data, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    with connect(daemon.paths) as c:
        c.publish(Manifest(KEY, pools, specs), [fd])
    os.close(fd)
    return data


def attached_bytes(daemon: DaemonProc) -> bytes:
    with connect(daemon.paths, timeout_s=5) as c:
        reply = c.attach(KEY)
        (fd,) = reply.take_fds()
        assert reply.answer().outcome is Outcome.OK
    with mmap.mmap(fd, 1024, mmap.MAP_PRIVATE, mmap.PROT_READ) as m:
        data = bytes(m)
    os.close(fd)
    return data


def test_a_full_fd_table_sheds_connections_and_loses_nothing(socket_dir):
    d = DaemonProc(socket_dir, max_fds=160)
    try:
        data = publish_one(d)
        baseline = resting_fds(d)
        attackers = []
        spare = sealed_memfd(64)
        for _ in range(40):  # each: half a header with many fds, then silence
            try:
                s = raw(d)
                s.sendmsg([b"\x00\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("60i", *[spare] * 60))])
                attackers.append(s)
            except OSError:
                break
        time.sleep(1.5)  # past the stall time: the stalled connections may be shed
        for _attempt in range(20):  # shedding may take the first tries; serving goes on
            r = run_cli("status", "--json", "--socket-dir", str(socket_dir), timeout=30)
            if r.returncode == 0:
                break
        assert r.returncode == 0, r.stderr
        assert attached_bytes(d) == data
        assert d.proc.poll() is None
        for s in attackers:
            s.close()
        os.close(spare)
        assert settle_fds(d, baseline) == baseline
        assert "fd table full" in d.log() or "too_many_fds" in d.log()
        assert "Traceback" not in d.log()
    finally:
        d.stop()


def test_silent_connections_cannot_lock_others_out(daemon):
    data = publish_one(daemon)
    idle = [raw(daemon) for _ in range(200)]  # one pid, far over its cap and the table
    try:
        time.sleep(0.2)
        r = run_cli("status", "--json", "--socket-dir", str(daemon.paths.directory))
        assert r.returncode == 0, r.stderr
        assert attached_bytes(daemon) == data
        status = open(f"/proc/{daemon.pid}/status").read().splitlines()
        threads = int(next(line.split()[1] for line in status if line.startswith("Threads")))
        assert threads <= 16 + 8, threads  # the pid's cap, not 200 threads
    finally:
        for s in idle:
            s.close()


@pytest.mark.slow  # waits out the daemon's 10 s frame deadline
def test_a_frame_must_finish_within_its_deadline(socket_dir):
    d = DaemonProc(socket_dir)
    try:
        with raw(d) as s:
            s.sendall(struct.pack(">I", 100) + b"x")  # starts a frame, then stalls
            s.settimeout(20)
            start = time.monotonic()
            reply = recv_message(s)[0]
            assert reply.code == "slow_frame" and 9 <= time.monotonic() - start < 15
    finally:
        d.stop()


def test_huge_keys_cost_little_and_always_get_a_typed_reply(daemon):
    publish_one(daemon)
    wire = KEY.to_wire()
    with raw(daemon) as s:  # 1,000,000 shards (~12 MB): refused from the header alone
        send_frame(s, msgpack.packb({"op": "attach", "key": {**wire, "shards": [["s", i, "h", "c"]
                                                                                  for i in range(1_000_000)]}}))
        reply = recv_message(s)[0]
        assert reply.code == "frame_too_large" and "only a publish" in reply.message
    with raw(daemon) as s:  # under the small-frame cap but over the shard count
        send_frame(s, msgpack.packb({"op": "attach", "key": {**wire, "shards": [["s", i, "h", "c"]
                                                                                  for i in range(20_000)]}}))
        reply = recv_message(s)[0]
        assert reply.code == "bad_message" and "key.shards has 20000 entries; at most 16384" in reply.message
    many = [[f"model-{i:05d}.safetensors", i + 1, "h", "c"] for i in range(16000)]
    with raw(daemon) as s:  # a mismatch against 16,000 shards: a bounded reply
        send_frame(s, msgpack.packb({"op": "attach", "key": {**wire, "shards": many}}))
        reply = recv_message(s)[0]
        assert type(reply).__name__ == "AttachMismatch" and len(reply.diffs) == 33
        assert reply.diffs[-1].startswith("... and ") and reply.diffs[-1].endswith(" more differences")
    rss_kib = int(next(line.split()[1] for line in open(f"/proc/{daemon.pid}/status") if line.startswith("VmRSS")))
    assert rss_kib < 200 * 1024, rss_kib


def test_type_confused_frames_get_typed_replies_and_no_traceback(daemon):
    frames = [
        msgpack.packb({"op": "hello", "extra": 1, b"version": 2}),  # str and bytes field names mixed
        msgpack.packb({"op": "attach", "key": {**KEY.to_wire(), "zzz": 1, b"dtype": "x"}}),
        msgpack.packb({"op": "publish", "manifest": {"key": 1, "pools": [[1, 2]], "tensors": [], "aliases": {},
                                                     "load_s": 0}}),
        msgpack.packb({"op": "release", "key_short": None, "all": "yes"}),
    ]
    with raw(daemon) as s:
        for payload in frames:
            send_frame(s, payload)
            assert recv_message(s)[0].code == "bad_message"
    assert "Traceback" not in daemon.log()


def test_rejection_lines_are_bounded_and_rate_limited(daemon):
    with raw(daemon) as s:
        for _ in range(200):
            send_frame(s, msgpack.packb({"op": "x" * 100_000}))
            assert recv_message(s)[0].code == "unknown_op"
    lines = [line for line in daemon.log().splitlines() if "request rejected" in line]
    assert 1 <= len(lines) <= 20  # the burst; the rest are counted, not written
    assert max(len(line) for line in daemon.log().splitlines()) < 1000
