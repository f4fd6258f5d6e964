"""Protocol and wire: golden frames, strict decoding, fds over SCM_RIGHTS, no fd leaked on any error.

Run: pytest tests/test_protocol.py
"""

from __future__ import annotations

import os
import socket
import struct

import msgpack
import pytest
from conftest import open_fds

from hotweights.errors import ProtocolError
from hotweights.key import CacheKey, ShardId
from hotweights.manifest import Manifest, pack
from hotweights.protocol import (
    Attach, AttachMismatch, Error, Hello, Publish, Release, StatusOk, decode, encode, recv_message, send_message,
)
from hotweights.wire import MAX_FDS_PER_FRAME, MAX_FRAME_BYTES, recv_frame, send_frame

KEY = CacheKey(shards=(ShardId("m", 1, "h", "c"),), arch="A", dtype="float16", model="m")


def test_golden_frame_bytes(pair):
    assert encode(Hello(1)) == b"\x82\xa2op\xa5hello\xa7version\x01"
    assert encode(Release("abc", False)) == b"\x83\xa2op\xa7release\xa9key_short\xa3abc\xa3all\xc2"
    a, b = pair
    send_message(a, Hello(1))
    assert b.recv(100) == b"\x00\x00\x00\x13\x82\xa2op\xa5hello\xa7version\x01"


@pytest.mark.parametrize("msg", [
    Hello(1), Attach(KEY), Release("", True), Error("x", "y"), AttachMismatch("m", "k", ["a: b"]),
    StatusOk(1, "0.1", 2.5, [{"key": "k"}], {"cpu": 3}, False),
])
def test_roundtrip(msg):
    assert decode(encode(msg)) == msg


def test_publish_roundtrip_keeps_manifest():
    pools, specs = pack([("w", "float16", (4,))], pool_bytes=1024, device="cpu")
    msg = Publish(Manifest(KEY, pools, specs))
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize("body, message", [
    ({"op": "format_disk"}, "unknown op 'format_disk'"),
    ({"version": 1}, "unknown op None"),
    ({"op": "hello"}, "op 'hello': unexpected fields [], missing fields ['version']"),
    ({"op": "hello", "version": 1, "x": 2}, "op 'hello': unexpected fields ['x'], missing fields []"),
    ({"op": "hello", "version": True}, "op 'hello' field 'version' must be int, got bool"),
    ({"op": "release", "key_short": 5, "all": False}, "field 'key_short' must be str, got int"),
    ({"op": "attach", "key": {"dtype": "x"}, }, "op 'attach' field 'key': key fields"),
    ([1, 2], "frame is not a msgpack map"),
])
def test_decode_rejects_with_exact_reason(body, message):
    with pytest.raises(ProtocolError) as err:
        decode(msgpack.packb(body))
    assert message in str(err.value)


def test_decode_rejects_garbage():
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode(b"\xc1\xc1\xc1")


def test_fds_travel_and_are_distinct(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        send_message(a, Hello(1), [r, w])
        msg, fds = recv_message(b)
        assert msg == Hello(1) and len(fds) == 2 and not {r, w} & set(fds)
        os.write(fds[1], b"ok")
        assert os.read(r, 2) == b"ok"
        for fd in fds:
            os.close(fd)
    finally:
        os.close(r)
        os.close(w)


def test_oversized_length_is_rejected_before_reading_the_body(pair):
    a, b = pair
    a.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))  # no body follows: reading it would block
    with pytest.raises(ProtocolError, match="exceeds MAX_FRAME_BYTES") as err:
        recv_frame(b)
    assert err.value.code == "frame_too_large"


def test_truncated_frame_closes_received_fds(pair):
    a, b = pair
    r, w = os.pipe()
    before = open_fds()
    frame = struct.pack(">I", 100) + b"short"
    a.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("ii", r, w))])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="closed after 5 of 100"):
        recv_frame(b)
    assert open_fds() == before
    os.close(r)
    os.close(w)


def test_bad_message_with_fds_closes_them(pair):
    a, b = pair
    r, w = os.pipe()
    before = open_fds()
    send_frame(a, msgpack.packb({"op": "nope"}), [r, w])
    with pytest.raises(ProtocolError, match="unknown op"):
        recv_message(b)
    assert open_fds() == before
    os.close(r)
    os.close(w)


def test_clean_close_is_eof_not_error(pair):
    a, b = pair
    a.close()
    with pytest.raises(EOFError):
        recv_frame(b)


def test_sender_refuses_too_many_fds_and_oversized_frames(pair):
    a, _ = pair
    with pytest.raises(ProtocolError, match="exceed MAX_FDS_PER_FRAME"):
        send_frame(a, b"x", [0] * (MAX_FDS_PER_FRAME + 1))
    with pytest.raises(ProtocolError, match="exceeds MAX_FRAME_BYTES"):
        send_frame(a, b"x" * (MAX_FRAME_BYTES + 1))
