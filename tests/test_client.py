"""Client: the two-step attach reply (pools handed over before validation, every fd
accounted for), the daemon's answers checked against the key, and ``connect_for``.

Run: pytest tests/test_client.py
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

import msgpack
import pytest
from conftest import open_fds

from hotweights.client import Client, Outcome, connect_for
from hotweights.config import AttachConfig
from hotweights.errors import DaemonUnavailable, ProtocolError, WrongEntry
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack
from hotweights.protocol import AttachMiss, AttachOk, Error, encode
from hotweights.wire import recv_frame, send_frame

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m")


def _send_attach_ok(sock: socket.socket, *, key: CacheKey = KEY, fds_short: int = 0, device: str = "cpu"):
    pools, specs = pack([("w", "float16", (4,)), ("v", "float16", (300,))], pool_bytes=512, device="cpu")
    fds = []
    for p in pools:
        fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, p.nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        fds.append(fd)
    body = msgpack.unpackb(encode(AttachOk(Manifest(key, pools, specs))))
    body["manifest"]["pools"] = [[n, device] for n, _ in body["manifest"]["pools"]]  # a lying daemon
    send_frame(sock, msgpack.packb(body), fds[:len(fds) - fds_short])
    for fd in fds:
        os.close(fd)
    return pools


def test_attach_hands_over_pools_before_validation(pair):
    a, b = pair
    before = open_fds()
    pools = _send_attach_ok(b)
    reply = Client(a, Path("x")).attach(KEY)
    assert reply.pools == list(pools)
    fds = reply.take_fds()
    assert len(fds) == 2
    for fd in fds:
        os.close(fd)
    answer = reply.answer()
    assert answer.outcome is Outcome.OK and answer.manifest.pools == pools
    recv_frame(b)  # the Attach request
    assert open_fds() <= before


def test_attach_with_missing_fds_refuses_and_closes_them(pair):
    a, b = pair
    before = open_fds()
    _send_attach_ok(b, fds_short=1)
    reply = Client(a, Path("x")).attach(KEY)
    assert reply.pools == []  # nothing to map: the fds do not match the pools
    with pytest.raises(ProtocolError, match="bad attach reply AttachOk with 1 fds"):
        reply.answer()
    recv_frame(b)
    assert open_fds() <= before


def test_attach_answered_with_another_key_is_a_wrong_entry(pair):
    a, b = pair
    before = open_fds()
    other = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="bfloat16", model="m")
    _send_attach_ok(b, key=other)
    reply = Client(a, Path("x")).attach(KEY)
    with pytest.raises(WrongEntry, match=f"daemon answered key {other.short} for {KEY.short}"):
        reply.answer()
    recv_frame(b)
    assert open_fds() <= before


def test_attach_answered_with_pools_on_another_device_is_refused_before_mapping(pair):
    a, b = pair
    before = open_fds()
    _send_attach_ok(b, device="cuda:GPU-x")
    with pytest.raises(WrongEntry, match="pools on cuda:GPU-x for a key on cpu"):
        Client(a, Path("x")).attach(KEY)
    recv_frame(b)
    assert open_fds() <= before


def test_pools_that_are_not_what_they_claim_are_refused_before_mapping(pair):
    a, b = pair
    before = open_fds()
    gpu_key = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m",
                       device_kind="cuda", device_id="GPU-x")
    _send_attach_ok(b, device="cuda:GPU-x")  # memfds where CUDA allocations belong
    with pytest.raises(ProtocolError, match=r"daemon sent a pool this engine will not map: pool 0: fd is "
                                            r"/memfd:t \(deleted\), not a CUDA allocation"):
        Client(a, Path("x")).attach(gpu_key)
    recv_frame(b)
    assert open_fds() <= before


def test_a_miss_with_fds_attached_is_refused(pair):
    a, b = pair
    before = open_fds()
    fd = os.memfd_create("t")
    send_frame(b, encode(AttachMiss("nothing")), [fd])
    os.close(fd)
    reply = Client(a, Path("x")).attach(KEY)
    with pytest.raises(ProtocolError, match="bad attach reply AttachMiss with 1 fds"):
        reply.answer()
    recv_frame(b)
    assert open_fds() <= before


def test_connect_for_honours_socket_path_even_for_publishers(daemon, tmp_path):
    # the default lookup would find no daemon there; socket_path names the real one
    config = AttachConfig(socket_dir=str(tmp_path / "elsewhere"), socket_path=str(daemon.paths.socket))
    with connect_for(config, start=True) as client:
        assert client.socket_path == daemon.paths.socket
    with pytest.raises(DaemonUnavailable, match="no daemon socket at"):
        connect_for(AttachConfig(socket_path=str(tmp_path / "none.sock"), state_timeout_s=0.1), start=True)
    assert not (tmp_path / "elsewhere").exists()  # no daemon was started at the default path


def test_a_lookup_takes_no_fds_and_counts_no_attach(models, daemon):
    from conftest import run_cli

    from hotweights.loading.checkpoint import checkpoint_key, open_checkpoint

    sock = str(daemon.paths.directory)
    assert run_cli("preload", "--model", str(models["tiny"]), "--socket-dir", sock).returncode == 0
    ckpt = open_checkpoint(models["tiny"])
    held, other = checkpoint_key(ckpt, dtype="float32"), checkpoint_key(ckpt, dtype="float16")
    before = open_fds()
    with connect_for(AttachConfig(socket_dir=sock)) as client:
        found, mismatch = client.lookup(held), client.lookup(other)
        row = client.entry(held)
    assert found.outcome is Outcome.OK and found.nbytes == row.nbytes > 0 and found.manifest is None
    assert mismatch.outcome is Outcome.MISMATCH and "dtype: cached=float32 requested=float16" in mismatch.reason
    assert row.num_attaches == 0 and open_fds() <= before


def test_a_lookup_of_a_daemon_from_before_lookups_asks_with_an_attach(pair):
    a, b = pair
    before = open_fds()
    send_frame(b, encode(Error("unknown_op", "unknown op 'lookup'")))  # an older daemon
    _send_attach_ok(b)  # ... then answers the attach that the client asks instead
    answer = Client(a, Path("x")).lookup(KEY)
    assert answer.outcome is Outcome.OK and answer.nbytes == sum(p.nbytes for p in answer.manifest.pools)
    assert open_fds() <= before
