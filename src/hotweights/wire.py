"""Frames on a Unix stream socket: length-prefixed bytes with file descriptors.

Frame = 4-byte big-endian length + payload (one msgpack map, see ``protocol.py``). File
descriptors travel as ``SCM_RIGHTS`` ancillary data on the frame's first bytes. Checks
run cheapest and most dangerous first: the length is checked against
``MAX_FRAME_BYTES`` before a body byte is read, ancillary truncation (``MSG_CTRUNC``) is
an error, and every fd received is closed on every error path.

A receiver that must not be held up (the daemon) passes a ``deadline``: once a frame
has started, all of it must arrive by then (``slow_frame`` otherwise).

Stdlib only. Not covered: what a payload means (``protocol.py``).
"""

from __future__ import annotations

import array
import os
import socket
import struct
import time

from .errors import ProtocolError

MAX_FRAME_BYTES = 32 << 20  # a 100k-tensor manifest is ~15 MiB
MAX_FDS_PER_FRAME = 253  # Linux SCM_MAX_FD
_HEADER = struct.Struct(">I")
_FD_SIZE = array.array("i").itemsize


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


def recv_frame(sock: socket.socket, *, deadline: float | None = None) -> tuple[bytes, list[int]]:
    """One frame and its fds (the caller owns them). EOFError on a clean close before a
    frame starts, ProtocolError on a broken, oversized or (past ``deadline``) slow frame."""
    length, fds = recv_header(sock, deadline=deadline)
    try:
        return recv_body(sock, length, deadline=deadline), fds
    except BaseException:
        close_fds(fds)
        raise


def wait_for_frame(sock: socket.socket) -> bool:
    """Block (socket timeout) until a frame starts, consuming nothing; False on a clean close."""
    return bool(sock.recv(1, socket.MSG_PEEK))


def recv_header(sock: socket.socket, *, deadline: float | None = None) -> tuple[int, list[int]]:
    """The frame length (checked against ``MAX_FRAME_BYTES``) and the fds sent with the header."""
    fds: list[int] = []
    try:
        header = bytearray()
        while len(header) < _HEADER.size:
            _arm(sock, deadline)
            chunk, ancdata, flags, _ = sock.recvmsg(
                _HEADER.size - len(header), socket.CMSG_SPACE(MAX_FDS_PER_FRAME * _FD_SIZE)
            )
            fds.extend(_fds_from(ancdata))
            if flags & socket.MSG_CTRUNC or len(fds) > MAX_FDS_PER_FRAME:
                raise ProtocolError(f"more than {MAX_FDS_PER_FRAME} fds in one frame (or no room for them)",
                                    code="too_many_fds")
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
        return length, fds
    except TimeoutError:
        close_fds(fds)
        if deadline is None:
            raise
        raise ProtocolError("frame header not complete within the frame deadline", code="slow_frame") from None
    except BaseException:
        close_fds(fds)
        raise


def recv_body(sock: socket.socket, length: int, *, deadline: float | None = None) -> bytes:
    body = bytearray(length)
    view = memoryview(body)
    got = 0
    try:
        while got < length:
            _arm(sock, deadline)
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ProtocolError(f"connection closed after {got} of {length} frame bytes", code="truncated")
            got += n
    except TimeoutError:
        if deadline is None:
            raise
        raise ProtocolError(f"frame of {length} bytes not complete within the frame deadline ({got} read)",
                            code="slow_frame") from None
    return bytes(body)


def _arm(sock: socket.socket, deadline: float | None) -> None:
    if deadline is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)


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
