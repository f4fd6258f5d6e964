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
    Attach, AttachMismatch, EntryRow, Error, ExportEnd, ExportOk, Hello, Publish, Release, StatusOk, Stop, decode,
    encode, recv_message, send_message,
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
    assert open_fds() <= before
    os.close(r)
    os.close(w)


def test_bad_message_with_fds_closes_them(pair):
    a, b = pair
    r, w = os.pipe()
    before = open_fds()
    send_frame(a, msgpack.packb({"op": "nope"}), [r, w])
    with pytest.raises(ProtocolError, match="unknown op"):
        recv_message(b)
    assert open_fds() <= before
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


ROW = {"key": "k", "model": "m", "dtype": "bfloat16", "arch": "A", "layout": "checkpoint", "device": "cpu",
       "tp": "0/1", "nbytes": 4096, "tensor_nbytes": 4000, "num_tensors": 3, "num_pools": 1, "num_attaches": 2,
       "published_at": 1.5, "host_nbytes": 0, "parked": "", "parked_bytes": 0}


def test_a_status_row_is_typed_and_an_older_daemons_row_still_decodes():
    row = EntryRow.from_wire(ROW)
    assert row.to_wire() == ROW and row.tensor_nbytes == 4000
    newer = ("tensor_nbytes", "arch", "num_pools", "published_at", "host_nbytes", "parked", "parked_bytes")
    older = {k: v for k, v in ROW.items() if k not in newer}
    old = EntryRow.from_wire(older)
    assert old.tensor_nbytes == 4096 and old.num_pools == 0  # its pool bytes stand in
    assert StatusOk(1, "0.1", 2.5, [ROW], {"cpu": 4096}, False).rows() == [row]


@pytest.mark.parametrize("field, value", [("nbytes", "4096"), ("key", 1), ("num_tensors", True), ("model", None)])
def test_a_mistyped_status_row_is_refused_naming_the_field(field, value):
    with pytest.raises(ProtocolError, match=f"status row field '{field}'"):
        EntryRow.from_wire({**ROW, field: value})


def test_export_replies_have_their_own_messages():
    pools, specs = pack([("w", "float16", (4,))], pool_bytes=1024, device="cpu")
    msg = ExportOk(Manifest(KEY, pools, specs))
    assert decode(encode(msg)) == msg and decode(encode(ExportEnd())) == ExportEnd()


def test_a_field_at_its_default_is_not_sent():
    # an older peer of the same protocol version reads the message as before (it rejects fields it lacks)
    assert encode(Stop()) == msgpack.packb({"op": "stop"}) and b"restart" in encode(Stop(restart=True))
    assert b"service_manager" not in encode(StatusOk(1, "0.1", 2.5, [], {}, False))
