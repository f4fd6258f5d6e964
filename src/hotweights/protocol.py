"""Wire format between clients and the daemon: typed messages, one codec, hard limits.

Frame = 4-byte big-endian length + one msgpack map tagged by ``op``. File descriptors
travel as ``SCM_RIGHTS`` ancillary data on the frame's first bytes. Checks run cheapest
and most dangerous first: the length is checked against ``MAX_FRAME_BYTES`` before a
body byte is read, ancillary truncation (``MSG_CTRUNC``) is an error, and every fd
received is closed on every error path. Decoding rejects unknown ops, missing or extra
fields and wrong types by name. No pickle.

Not covered: authentication (the daemon checks ``SO_PEERCRED``; see daemon.py) and
what the fds point at (the daemon checks memfd seals and sizes on publish).
"""

from __future__ import annotations

import array
import os
import socket
import struct
import typing
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from .errors import ManifestError, ProtocolError
from .key import CacheKey
from .manifest import Manifest, PoolSpec

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 32 << 20  # a 100k-tensor manifest is ~15 MiB
MAX_FDS_PER_FRAME = 253  # Linux SCM_MAX_FD
_HEADER = struct.Struct(">I")
_FD_SIZE = array.array("i").itemsize


# -- requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    version: int


@dataclass(frozen=True, slots=True)
class Status:
    pass


@dataclass(frozen=True, slots=True)
class Attach:
    key: CacheKey
    client_pid: int


@dataclass(frozen=True, slots=True)
class Publish:
    """Carries one fd per ``manifest.pools`` entry, in order."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class Release:
    """Release one entry by its short key, or every entry with ``all``."""

    key_short: str
    all: bool


@dataclass(frozen=True, slots=True)
class Stop:
    pass


# -- replies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloOk:
    version: int
    daemon_version: str
    pid: int


@dataclass(frozen=True, slots=True)
class StatusOk:
    pid: int
    daemon_version: str
    uptime_s: float
    entries: list
    bytes_by_device: dict
    torch_imported: bool


@dataclass(frozen=True, slots=True)
class AttachOk:
    """Carries one fd per pool, dup'd for this client: the client owns and closes them."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class AttachMiss:
    reason: str


@dataclass(frozen=True, slots=True)
class AttachMismatch:
    model: str
    key_short: str
    diffs: list


@dataclass(frozen=True, slots=True)
class PublishOk:
    key_short: str


@dataclass(frozen=True, slots=True)
class ReleaseOk:
    released: list


@dataclass(frozen=True, slots=True)
class StopOk:
    pass


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str


Message = (Hello | Status | Attach | Publish | Release | Stop | HelloOk | StatusOk | AttachOk
           | AttachMiss | AttachMismatch | PublishOk | ReleaseOk | StopOk | Error)

MESSAGES: dict[str, type] = {
    "hello": Hello, "status": Status, "attach": Attach, "publish": Publish, "release": Release,
    "stop": Stop, "hello_ok": HelloOk, "status_ok": StatusOk, "attach_ok": AttachOk,
    "attach_miss": AttachMiss, "attach_mismatch": AttachMismatch, "publish_ok": PublishOk,
    "release_ok": ReleaseOk, "stop_ok": StopOk, "error": Error,
}
_OPS = {cls: op for op, cls in MESSAGES.items()}
_HINTS = {cls: typing.get_type_hints(cls) for cls in MESSAGES.values()}


def encode(msg: Message) -> bytes:
    body: dict[str, Any] = {"op": _OPS[type(msg)]}
    for f in fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, Manifest):
            value = _manifest_wire(value)
        elif isinstance(value, CacheKey):
            value = value.to_wire()
        body[f.name] = value
    return msgpack.packb(body, use_bin_type=True)


# The daemon sends the same manifest on every attach; manifests are immutable, so their
# wire form is built once (identity-checked, a few kept).
_WIRE: dict[int, tuple[Manifest, dict[str, Any]]] = {}


def _manifest_wire(manifest: Manifest) -> dict[str, Any]:
    hit = _WIRE.get(id(manifest))
    if hit is not None and hit[0] is manifest:
        return hit[1]
    wire = manifest.to_wire()
    if len(_WIRE) >= 16:
        _WIRE.pop(next(iter(_WIRE)), None)
    _WIRE[id(manifest)] = (manifest, wire)
    return wire


def peek_pools(body: Any) -> list[PoolSpec] | None:
    """The pool specs of an unpacked ``attach_ok`` body, before the whole reply is validated.

    Lets an engine start mapping (and copying) pools while it validates the manifest;
    None for any other body or a malformed pool list (``decode_body`` then says what is wrong).
    """
    try:
        if not (isinstance(body, dict) and body.get("op") == "attach_ok"):
            return None
        return [PoolSpec(n, d) for n, d in body["manifest"]["pools"]]
    except (ValueError, TypeError, KeyError, ManifestError):
        return None


def unpack(data: bytes) -> Any:
    """Frame bytes -> msgpack value; ProtocolError if they are not msgpack."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"frame is not valid msgpack: {exc}", code="bad_frame") from None


def decode(data: bytes) -> Message:
    """Bytes -> message; ProtocolError names the op and field on any violation."""
    return decode_body(unpack(data))


def decode_body(body: Any) -> Message:
    """An unpacked frame -> message (``body`` is consumed)."""
    if not isinstance(body, dict):
        raise ProtocolError("frame is not a msgpack map", code="bad_frame")
    op = body.pop("op", None)
    cls = MESSAGES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(f"unknown op {op!r}; known ops: {sorted(MESSAGES)}", code="unknown_op")
    hints = _HINTS[cls]
    extra, missing = sorted(set(body) - set(hints)), sorted(set(hints) - set(body))
    if extra or missing:
        raise ProtocolError(f"op {op!r}: unexpected fields {extra}, missing fields {missing}", code="bad_message")
    kwargs = {name: _convert(op, name, body[name], hint) for name, hint in hints.items()}
    return cls(**kwargs)


def _convert(op: str, name: str, value: Any, hint: Any) -> Any:
    try:
        if hint is CacheKey:
            return CacheKey.from_wire(value)
        if hint is Manifest:
            return Manifest.from_wire(value)
    except (ValueError, ManifestError) as exc:
        raise ProtocolError(f"op {op!r} field {name!r}: {exc}", code="bad_message") from None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) if hint is float else (
        type(value) is hint if hint in (int, bool) else isinstance(value, hint))
    if not ok:
        raise ProtocolError(
            f"op {op!r} field {name!r} must be {hint.__name__}, got {type(value).__name__}", code="bad_message"
        )
    return float(value) if hint is float else value


# -- frames -----------------------------------------------------------------------------


def send_message(sock: socket.socket, msg: Message, fds: list[int] | tuple[int, ...] = ()) -> None:
    send_frame(sock, encode(msg), fds)


def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    if len(fds) > MAX_FDS_PER_FRAME:
        raise ProtocolError(f"{len(fds)} fds exceed MAX_FDS_PER_FRAME={MAX_FDS_PER_FRAME}")
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = sock.sendmsg([data], ancillary)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_message(sock: socket.socket) -> tuple[Message, list[int]]:
    """One message and the fds that came with it; the caller owns the fds."""
    payload, fds = recv_frame(sock)
    try:
        return decode(payload), fds
    except BaseException:
        close_fds(fds)
        raise


def recv_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Raise EOFError on a clean close before a frame starts, ProtocolError on a broken frame."""
    fds: list[int] = []
    try:
        header = bytearray()
        while len(header) < _HEADER.size:
            chunk, ancdata, flags, _ = sock.recvmsg(
                _HEADER.size - len(header), socket.CMSG_SPACE(MAX_FDS_PER_FRAME * _FD_SIZE)
            )
            fds.extend(_fds_from(ancdata))
            if flags & socket.MSG_CTRUNC:
                raise ProtocolError(f"more than {MAX_FDS_PER_FRAME} fds in one frame", code="too_many_fds")
            if not chunk:
                if not header and not fds:
                    raise EOFError("peer closed the connection")
                raise ProtocolError("connection closed inside a frame header", code="truncated")
            header += chunk
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ProtocolError(
                f"frame length {length} exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}", code="frame_too_large"
            )
        body = bytearray(length)
        view = memoryview(body)
        got = 0
        while got < length:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ProtocolError(f"connection closed after {got} of {length} frame bytes", code="truncated")
            got += n
        return bytes(body), fds
    except BaseException:
        close_fds(fds)
        raise


def _fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_SIZE
            fds.extend(array.array("i", data[:usable]))
    return fds


def close_fds(fds: list[int] | tuple[int, ...]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
